"""The tenant's task: a plain tenant-schemas-celery task (TenantTask is the app's task class), bound,
that knows nothing of cron_celery."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import connection

from tests.tenantproject.notes.models import Note


@shared_task(bind=True, name="tenantproject.write_note")
def write_note(self: Any, text: str) -> str:
    note = Note.objects.create(text=text, schema=connection.schema_name,
                               execution_id=self.request.get("cron_execution_id"))
    return f"{connection.schema_name}:{note.id}"
