"""The tenant project's Celery app: tenant-schemas-celery's, so each task runs in the schema its
message names (the ``_schema_name`` header)."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.tenantproject.settings")

from tenant_schemas_celery.app import CeleryApp

app = CeleryApp("tenantproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
