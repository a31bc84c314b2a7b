"""Email through Django's mail backend (SMTP in production)."""

from __future__ import annotations

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from cron_celery.notifiers.base import Channel, Message


class EmailChannel(Channel):
    """``{"recipients": ["ops@example.com"], "from_email": "cron@example.com"}``."""

    required = ("recipients",)

    def problems(self) -> list[str]:
        recipients = self.options.get("recipients")
        if recipients and (isinstance(recipients, str) or not all(isinstance(r, str) for r in recipients)):
            return ["option 'recipients' must be a list of addresses"]
        return super().problems()

    def send(self, message: Message, timeout: float) -> None:
        connection = get_connection(timeout=timeout)
        EmailMessage(
            subject=message.title, body=message.text(),
            from_email=self.options.get("from_email") or settings.DEFAULT_FROM_EMAIL,
            to=list(self.options["recipients"]), connection=connection,
        ).send(fail_silently=False)
