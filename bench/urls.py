"""URLs of ``bench/history.py``: the admin and cron_celery's endpoints."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls), path("cron/", include("cron_celery.urls"))]
