from __future__ import annotations

from django.apps import AppConfig


class ReportsConfig(AppConfig):
    name = "reports"
    verbose_name = "Reports (sample cron jobs)"
    default_auto_field = "django.db.models.BigAutoField"
