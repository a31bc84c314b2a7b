"""``manage.py demo_summary``: the beats, the alerts and the mail they became, and the
demo's checks (``--check``): every slot the beats dispatched ran once, nothing was left
unfinished, the failing sync failed and recovered, the feed import succeeded on a retry,
both alerts were delivered, and load-orders ran after each slot extract-orders succeeded in
(extract-orders sent its jitter's offset after each slot)."""

from __future__ import annotations

import email
import email.policy
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count

from cron_celery.models import Alert, AlertStatus, BeatHeartbeat, CronExecution, CronJob, Event, Status, Trigger

from ...tables import table


def mails(directory: Path) -> list[email.message.EmailMessage]:
    """The messages Django's file email backend wrote to ``directory``, oldest first."""
    found: list[email.message.EmailMessage] = []
    if not directory.is_dir():
        return found
    separator = b"\n" + b"-" * 79 + b"\n"
    for path in sorted(directory.iterdir(), key=lambda p: p.stat().st_mtime):
        for raw in path.read_bytes().split(separator):
            if raw.strip():
                found.append(email.message_from_bytes(raw.strip(), policy=email.policy.default))  # type: ignore[arg-type]
    return found


class Command(BaseCommand):
    help = "Print the beats, the alerts and the mail they became; --check verifies the demo's outcome."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="fail unless the demo went as it should")

    def handle(self, *args: Any, **options: Any) -> None:
        # The demo has stopped both beats by now, and a beat that stops gives up the lead: LEADING is no.
        self.section("Beats (their heartbeats; both stopped now, so neither leads)")
        beats = BeatHeartbeat.objects.order_by("started_at")
        rows: list[tuple[str, ...]] = [("BEAT (host:pid)", "STARTED", "LAST SEEN", "LEADING")]
        rows += [(b.identity, f"{b.started_at:%H:%M:%S}", f"{b.seen_at:%H:%M:%S}", "yes" if b.leading else "no")
                 for b in beats]
        self.lines(table(rows) if beats else ["No beat has run."])

        self.section("Alerts (the outbox)")
        alerts = list(Alert.objects.select_related("job", "execution").order_by("id"))
        rows = [("JOB", "EVENT", "CHANNEL", "STATUS", "TRIES", "SENT AT", "EXECUTION")]
        rows += [(a.job.name, a.event, a.channel, a.status, str(a.attempts),
                  f"{a.sent_at:%H:%M:%S}" if a.sent_at else "-", f"#{a.execution.run_number} {a.execution.status}")
                 for a in alerts]
        self.lines(table(rows) if alerts else ["No alerts."])

        file_path = getattr(settings, "EMAIL_FILE_PATH", "")
        directory = Path(file_path) if file_path else None
        messages = mails(directory) if directory else []
        if directory:
            self.section(f"The alert mail that would be sent (Django's file backend wrote it to {directory})")
            for message in messages:
                body = message.get_body(preferencelist=("plain",))
                text = body.get_content().strip() if body is not None else ""
                self.lines([f"To: {message['To']}", f"Subject: {message['Subject']}", "",
                            *("    " + line for line in text.splitlines()), ""])
            if not messages:
                self.lines(["No mail."])

        self.section("A chain and a jitter (extract-orders, then load-orders)")
        extract = CronJob.objects.filter(name="extract-orders").first()
        if extract is not None:
            self.lines([f"extract-orders is sent {extract.jitter_ms / 1000:.3f} s after each of its slots (jitter=5); "
                        "load-orders runs after it (after=), slot by slot:"])
            rows = [("SLOT", "EXTRACT", "SENT AT", "LOAD", "TRIGGER")]
            loads = {row.slot: row for row in CronExecution.objects.filter(task_name="load-orders")}
            for row in CronExecution.objects.filter(task_name="extract-orders", trigger=Trigger.BEAT).order_by("slot"):
                load = loads.get(row.slot)
                rows.append((f"{row.slot:%H:%M:%S}", row.status, f"{row.created_at:%H:%M:%S.%f}"[:12],
                             load.status if load else "-", load.trigger if load else "-"))
            self.lines(table(rows))

        if options["check"]:
            problems = self.problems(alerts, len(messages) if directory else None)
            if problems:
                raise CommandError("the demo did not go as expected:\n  - " + "\n  - ".join(problems))
            self.stdout.write(self.style.SUCCESS(
                "\nEvery slot the beats dispatched ran once; the failure, the retry and both alerts are on record."))

    def problems(self, alerts: list[Alert], mailed: int | None) -> list[str]:
        found: list[str] = []
        if unfinished := CronExecution.objects.exclude(status__in=Status.terminal()).count():
            found.append(f"{unfinished} executions are still pending, running or retrying")
        twice = (CronExecution.objects.filter(trigger=Trigger.BEAT).values("job", "slot")
                 .annotate(runs=Count("id")).filter(runs__gt=1))
        if twice.exists():
            found.append(f"slots dispatched more than once: {list(twice)}")
        beat_runs = CronExecution.objects.filter(trigger=Trigger.BEAT)
        if beat_runs.filter(task_name="cache-warmer", status=Status.SUCCEEDED).count() < 3:
            found.append("cache-warmer (every 10 s) succeeded fewer than 3 times")
        sync = list(beat_runs.filter(task_name="sync-partner-api").order_by("slot").values_list("status", flat=True))
        if sync[:1] != [Status.FAILED] or Status.SUCCEEDED not in sync:
            found.append(f"sync-partner-api should fail once, then succeed; its runs: {sync or 'none'}")
        if not beat_runs.filter(task_name="import-partner-feed", status=Status.SUCCEEDED, retry_count__gte=1).exists():
            found.append("import-partner-feed never succeeded on a retry")
        events = {(a.job.name, a.event) for a in alerts if a.status == AlertStatus.SENT}
        for wanted in (("sync-partner-api", Event.FAILED), ("sync-partner-api", Event.RECOVERED)):
            if wanted not in events:
                found.append(f"no {wanted[1]} alert for {wanted[0]} was delivered")
        extracted = list(beat_runs.filter(task_name="extract-orders", status=Status.SUCCEEDED)
                         .values_list("slot", "id"))
        loaded = dict(CronExecution.objects.filter(task_name="load-orders", status=Status.SUCCEEDED,
                                                   trigger=Trigger.UPSTREAM)
                      .values_list("slot", "upstream_execution_id"))
        if len(extracted) < 2 or any(loaded.get(slot) != execution_id for slot, execution_id in extracted):
            found.append(f"load-orders should run once after each extract-orders success: {len(extracted)} extracted, "
                         f"{len(loaded)} loaded")
        if beat_runs.filter(task_name="extract-orders", due_at__isnull=True).exists() or any(
                row.created_at < row.due_at for row in beat_runs.filter(task_name="extract-orders")):
            found.append("extract-orders was sent before its slot plus its jitter")
        sent_by_mail = sum(1 for a in alerts if a.channel == "email" and a.status == AlertStatus.SENT)
        if mailed is not None and mailed < sent_by_mail:
            found.append(f"{sent_by_mail} alerts were sent by email but {mailed} mails were written")
        return found

    def section(self, title: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"\n{title}"))

    def lines(self, lines: list[str]) -> None:
        for line in lines:
            self.stdout.write(line)
