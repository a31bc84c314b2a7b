"""``manage.py demo_watch``: let the beats and the worker run, report every few seconds, and
stop the leading beat half-way so the standby takes over.

    manage.py demo_watch --seconds 60 --beat beat-1=PID --beat beat-2=PID --worker-pid PID

Fails (exit status 1) if the worker or a beat dies on its own, if no beat leads within the
leader lease of the time to stop it, or if no standby takes over within the leader lease after
the leader was stopped; a failure says what each beat and its database sessions were doing.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from cron_celery import conf
from cron_celery.models import Alert, BeatHeartbeat, CronExecution

from ...processes import alive


def beat(text: str) -> tuple[str, int]:
    label, _, pid = text.partition("=")
    if not label or not pid.isdigit():
        raise ValueError(text)
    return label, int(pid)


class Command(BaseCommand):
    help = "Watch the demo's beats and worker for a while; stop the leading beat half-way."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, default=60.0)
        parser.add_argument("--every", type=float, default=10.0, help="seconds between reports")
        parser.add_argument("--beat", type=beat, action="append", required=True, metavar="LABEL=PID")
        parser.add_argument("--worker-pid", type=int, required=True)
        parser.add_argument("--stop-leader-at", type=float, default=None, metavar="SECONDS",
                            help="stop the leading beat (SIGTERM) this long after the start")

    def handle(self, *args: Any, **options: Any) -> None:
        self.beats: dict[int, str] = {pid: label for label, pid in options["beat"]}
        self.stopped: set[int] = set()
        started = time.monotonic()
        stop_at = options["stop_leader_at"]
        next_report = started + options["every"]
        while (now := time.monotonic()) < started + options["seconds"]:
            self.check_processes(options["worker_pid"])
            if stop_at is not None and now >= started + stop_at:
                self.hand_over()
                stop_at = None
            if now >= next_report:
                self.report(now - started)
                next_report += options["every"]
            time.sleep(0.2)
        self.report(time.monotonic() - started)

    def check_processes(self, worker: int) -> None:
        if not alive(worker):
            raise CommandError(f"the worker (pid {worker}) died")
        for pid, label in self.beats.items():
            if pid not in self.stopped and not alive(pid):
                raise CommandError(f"{label} (pid {pid}) died")

    def leader(self) -> str | None:
        """The label of the beat whose heartbeat says it leads."""
        for identity in BeatHeartbeat.objects.filter(leading=True).values_list("identity", flat=True):
            pid = identity.rpartition(":")[2]
            if pid.isdigit() and int(pid) in self.beats and int(pid) not in self.stopped:
                return self.beats[int(pid)]
        return None

    def hand_over(self) -> None:
        # On a busy machine the beats may still be starting: give them the lease's time to lead.
        label = self.wait_for_leader("no beat says it leads")
        pid = next(pid for pid, name in self.beats.items() if name == label)
        self.stdout.write(f"  stopping the leading beat, {label} (pid {pid}), with SIGTERM")
        os.kill(pid, signal.SIGTERM)
        self.stopped.add(pid)
        began = time.monotonic()
        # The leader releases its lease as it stops; a killed one would keep it until it expires.
        successor = self.wait_for_leader("no standby beat took over")
        self.stdout.write(f"  {successor} took over {time.monotonic() - began:.1f} s later")

    def wait_for_leader(self, failure: str) -> str:
        deadline = time.monotonic() + conf.settings.BEAT_LEASE_SECONDS + 10
        while (label := self.leader()) is None:
            if time.monotonic() > deadline:
                raise CommandError(f"{failure}\n{self.diagnosis()}")
            time.sleep(0.1)
        return label

    def diagnosis(self) -> str:
        """What each beat process is doing (its state and where the kernel has it wait) and what every
        other session of this database is doing: what a failure to lead needs to be understood."""
        lines = []
        for pid, label in self.beats.items():
            try:
                with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/wchan") as wchan:
                    state = stat.read().rpartition(")")[2].split()[0]
                    lines.append(f"  {label} (pid {pid}): state {state}, waiting in {wchan.read() or '-'}")
            except OSError as error:
                lines.append(f"  {label} (pid {pid}): {error.strerror}")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid, application_name, state, wait_event_type, wait_event, now() - xact_start,"
                           " left(query, 200) FROM pg_stat_activity WHERE datname = current_database()"
                           " AND pid <> pg_backend_pid() ORDER BY pid")
            lines += [f"  session {row[0]} {row[1]!r}: {row[2]}, waits {row[3]}/{row[4]}, in a transaction for"
                      f" {row[5]}: {row[6]}" for row in cursor.fetchall()]
        return "\n".join(lines)

    def report(self, elapsed: float) -> None:
        statuses = Counter(CronExecution.objects.values_list("status", flat=True))
        alerts = Counter(Alert.objects.values_list("status", flat=True))
        executions = ", ".join(f"{count} {status}" for status, count in sorted(statuses.items())) or "none yet"
        sent = ", ".join(f"{count} {status}" for status, count in sorted(alerts.items())) or "none"
        self.stdout.write(f"  {int(elapsed) // 60}:{int(elapsed) % 60:02d}  leader {self.leader() or '-'}"
                          f" | executions: {executions} | alerts: {sent}")
