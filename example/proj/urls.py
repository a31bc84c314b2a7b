from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path, re_path
from django.views.static import serve

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    path("cron/", include("cron_celery.urls")),
]

if settings.STATIC_ROOT:  # the container serves the admin's CSS itself (fine for an example)
    urlpatterns.append(re_path(r"^static/(?P<path>.*)$", serve, {"document_root": settings.STATIC_ROOT}))
