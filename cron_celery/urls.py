"""``path("cron/", include("cron_celery.urls"))`` — see ``views`` for what each answers."""

from __future__ import annotations

from django.urls import path

from cron_celery.web import views

app_name = "cron_celery"
urlpatterns = [
    path("status/", views.status, name="status"),
    path("health/", views.health_view, name="health"),
    path("metrics/", views.metrics_view, name="metrics"),
    path("run/<str:job>/", views.run, name="run"),
    path("pause/<str:job>/", views.pause, name="pause"),
    path("resume/<str:job>/", views.resume, name="resume"),
    path("audit/", views.audit_view, name="audit"),
]
