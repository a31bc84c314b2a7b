"""Database tables: the jobs (``CronJob``) and every run of their slots (``CronExecution``).

Rows are changed by the conditional SQL in ``claims``; the models are for reading,
the admin, and the queries users already know from the original design::

    CronExecution.objects.filter(success=False, execution_date__gte=week_ago)
"""

from __future__ import annotations

import datetime as dt

from django.db import models
from django.db.models.functions import Now

from cron_celery.enums import AlertStatus, CatchUp, Event, ExecutionPattern, Overlap, SkipReason, Status, Trigger

# The enums live in ``enums`` (plain Python); they can be imported from here too, as before.
__all__ = ["OPERATE_PERMISSION", "Alert", "AlertStatus", "BeatHeartbeat", "CatchUp", "CronExecution", "CronJob",
           "Event", "ExecutionPattern", "Lease", "Overlap", "SkipReason", "Status", "Tally", "TrackedPeriodicTask",
           "Trigger"]

#: Who may act on jobs — run now, pause, resume, backfill, re-run, mark LOST, send alerts
#: again (admin actions) and POST the run endpoint with a session: Django's "Can change cron
#: job" permission. Viewing needs only staff status; superusers have every permission.
OPERATE_PERMISSION = "cron_celery.change_cronjob"


class CronJob(models.Model):
    """A registered job. Declared in code; the row holds its live state and its fence."""

    name = models.SlugField(max_length=100, unique=True)
    code = models.CharField(max_length=50, unique=True)
    task = models.CharField(max_length=200, help_text="Celery task name")
    pattern = models.CharField(max_length=20, choices=ExecutionPattern.choices())
    overlap = models.CharField(max_length=10, choices=Overlap.choices())
    timezone = models.CharField(max_length=64, default="UTC")
    description = models.TextField(blank=True)
    paused = models.BooleanField(default=False)
    # What a person (or pause_after_failures) said of the pause in effect: cleared by the database
    # (``cron_celery_job_pause``) whenever the job is resumed, however it is resumed.
    pause_note = models.TextField(blank=True, db_default="", help_text="Why the job is paused; empty = no note")
    paused_by = models.CharField(max_length=150, blank=True, db_default="",
                                 help_text="Who paused it (an admin user, an API token's owner, cron_celery)")
    paused_at = models.DateTimeField(null=True, blank=True, help_text="When the pause in effect began (UTC)")
    paused_until = models.DateTimeField(
        null=True, blank=True, help_text="When the job resumes itself, by the database's clock (UTC); "
                                         "empty = until a person resumes it")
    catch_up = models.CharField(max_length=10, choices=CatchUp.choices(), default=CatchUp.LATEST.value)
    catch_up_window = models.FloatField(
        null=True, blank=True, help_text="Seconds: a slot the beat missed that is older than this is recorded "
                                         "MISSED whatever catch_up says; empty = no window. Declared in code",
    )
    next_run_at = models.DateTimeField(
        null=True, blank=True, db_index=True, help_text="The first slot not dispatched yet (UTC)"
    )
    # The schedule in effect: declared in code, then editable in the admin through the
    # django-celery-beat periodic task it is synced to (see ``schedule_sync``).
    periodic_task = models.OneToOneField(
        "django_celery_beat.PeriodicTask", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="cron_job", help_text="Where the schedule is edited in the admin",
    )
    schedule = models.CharField(
        max_length=200, blank=True, db_default="", help_text="Five-field cron, or 'every Ns' for an interval"
    )
    schedule_timezone = models.CharField(max_length=64, blank=True, db_default="")
    schedule_problem = models.TextField(
        blank=True, db_default="",
        help_text="Why the periodic task's schedule cannot drive the job (the job keeps its previous one); "
                  "empty when it is in effect",
    )
    declaration_hash = models.CharField(
        max_length=64, blank=True, db_default="", help_text="The code's schedule at the last sync"
    )
    # Bumped by database triggers on every edit of the periodic task or its schedule row;
    # the beat re-reads a job while ``schedule_seen`` lags behind.
    schedule_version = models.BigIntegerField(db_default=0)
    schedule_seen = models.BigIntegerField(db_default=0)
    fence = models.BigIntegerField(default=0, help_text="Grows with every claim of this job")
    max_retries = models.IntegerField(
        db_default=0, help_text="Attempts after the first one; enforced here, not only in the message"
    )
    alert_after = models.IntegerField(db_default=1, help_text="Consecutive failures before the first alert")
    max_concurrency = models.IntegerField(
        null=True, blank=True,
        help_text="Live runs allowed at once (1 for overlap 'skip'); empty = any number. Declared in code",
    )
    concurrency_group = models.CharField(
        max_length=100, blank=True, db_default="",
        help_text="The shared limit this job counts against (CONCURRENCY_GROUPS); empty = none. Declared in code",
    )
    jitter_ms = models.IntegerField(
        db_default=0, help_text="Each slot is sent this many milliseconds after it (its jitter). Declared in code",
    )
    # Kept by a trigger (``cron_celery_job_due``): next_run_at plus the jitter, what the beat's "is it due" reads.
    due_at = models.DateTimeField(
        null=True, blank=True, editable=False, db_index=True,
        help_text="When the next slot is sent: next_run_at + jitter (UTC)",
    )
    # The active window in effect (``cron_celery_job_due``): copied from the periodic task's start_time and
    # expires (written there from the code's active_from / active_until, editable in the admin).
    active_from = models.DateTimeField(
        null=True, blank=True, help_text="No slot before this is dispatched or recorded (UTC); empty = no start",
    )
    active_until = models.DateTimeField(
        null=True, blank=True, help_text="No slot at or after this is dispatched or recorded (UTC); empty = no end",
    )
    one_off = models.BooleanField(
        db_default=False, help_text="The periodic task's one_off: after one slot is sent, the job is paused",
    )
    # A job the code no longer declares: set by the schedule sync of the deploy that
    # removed it, which retires what it left (``removals``); cleared when the code declares it again.
    removed_at = models.DateTimeField(
        null=True, blank=True, help_text="When a deploy found it no longer declared in the code (its edges and "
                                         "waiting runs were retired then); empty = declared",
    )
    alert_repeat = models.IntegerField(
        null=True, blank=True, help_text="Seconds between repeated alerts of one incident; empty = once"
    )
    # Timing alerts, declared in code: read by the reconciler's queries (LATE,
    # LONG_RUNNING) and by the final write of a success (TOO_FAST).
    start_deadline = models.FloatField(
        null=True, blank=True, help_text="Seconds after it was due by which a run must have started, "
                                         "else one LATE alert; empty = no deadline. Declared in code",
    )
    max_runtime = models.FloatField(
        null=True, blank=True, help_text="Seconds a run may take before one LONG_RUNNING alert (it is not "
                                         "stopped); empty = no bound. Declared in code",
    )
    min_runtime = models.FloatField(
        null=True, blank=True, help_text="A success faster than this many seconds alerts TOO_FAST; "
                                         "empty = no bound. Declared in code",
    )
    # Runs with parameters: the periodic task's kwargs in effect, checked against the
    # job's parameters when the edit is applied; the beat writes them on each execution it inserts.
    params = models.JSONField(
        null=True, blank=True, help_text="The parameter values of its scheduled runs: the periodic task's kwargs, "
                                         "checked (a refused edit leaves the previous ones); empty = none",
    )
    alerted_at = models.DateTimeField(
        null=True, blank=True, help_text="When the open incident was last alerted; empty = no alerted incident"
    )
    consecutive_failures = models.IntegerField(default=0)
    pause_after_failures = models.IntegerField(
        null=True, blank=True, help_text="After this many final failures in a row the job pauses itself (and "
                                         "alerts PAUSED); empty = never. Declared in code")
    # The too-fast incident, kept like the failures' by the success's final write.
    too_fast_in_a_row = models.IntegerField(
        db_default=0, help_text="Successes in a row faster than min_runtime (a failure leaves the count alone)"
    )
    too_fast_alerted_at = models.DateTimeField(
        null=True, blank=True, help_text="When the open too-fast incident was last alerted; empty = none alerted"
    )
    fenced_count = models.IntegerField(
        db_default=0, help_text="Outcomes not recorded because another worker had taken the run over"
    )
    last_status = models.CharField(max_length=20, choices=Status.choices(), blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "cron job"
        indexes = [
            models.Index(
                fields=["id"], name="cron_job_schedule_edited",
                condition=~models.Q(schedule_version=models.F("schedule_seen")),
            ),
            # The beat's idle tick: the next pause to end (``pauses``).
            models.Index(fields=["paused_until"], name="cron_job_pause_ends",
                         condition=models.Q(paused_until__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.code})"


class TrackedPeriodicTask(models.Model):
    """One of django-celery-beat's periodic tasks as a person chose it in the admin: tracked as a job or
    left out, whatever ``TRACK_PERIODIC_TASKS`` says, and its catch-up policy (``tracking.selection``)."""

    periodic_task = models.OneToOneField("django_celery_beat.PeriodicTask", on_delete=models.CASCADE,
                                         related_name="cron_tracking")
    track = models.BooleanField(
        null=True, blank=True, verbose_name="tracked by cron_celery",
        help_text="Yes: tracked as a job (an execution per slot, sent and run once); no: sent untracked; "
                  "empty: as TRACK_PERIODIC_TASKS says")
    catch_up = models.CharField(
        max_length=10, blank=True, choices=CatchUp.choices(),
        help_text="Slots the beat missed while it was down: none (recorded MISSED), latest or all; empty: "
                  "TRACKED_CATCH_UP")

    class Meta:
        verbose_name = "tracking by cron_celery"
        verbose_name_plural = "tracking by cron_celery"

    def __str__(self) -> str:
        return f"tracking of periodic task {self.periodic_task_id}"


class CronExecution(models.Model):
    """One run of one slot of a job; retries are attempts inside it (``retry_count``)."""

    #: Not indexed on their own: every write of a run pays for each index of this table (a run
    #: inserts one row and rewrites it when it ends), and the indexes below lead with ``job`` and
    #: ``task_code`` already; ``task_name`` and ``celery_task_id`` are only searched with
    #: ``icontains`` (the admin), which no b-tree serves, and the package never looks a row up by
    #: its Celery task id (a revoked or lost run is found by its job, worker and pid).
    job = models.ForeignKey(CronJob, on_delete=models.CASCADE, related_name="executions", db_index=False)
    task_code = models.CharField(max_length=50)
    task_name = models.CharField(max_length=100)
    slot = models.DateTimeField(help_text="The scheduled instant, stored in UTC")
    execution_date = models.DateField(help_text="The slot's local date in the job's timezone")
    run_number = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=20, choices=Status.choices(), default=Status.PENDING.value)
    trigger = models.CharField(max_length=20, choices=Trigger.choices(), default=Trigger.BEAT.value)
    skip_reason = models.CharField(max_length=20, choices=SkipReason.choices(), blank=True)
    forced = models.BooleanField(default=False, help_text="Run past the slot check on purpose")
    force = models.BooleanField(
        db_default=False, help_text="Sent with --force: runs even while the job is paused, however often it is sent"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    ended = models.DateTimeField(null=True, blank=True)
    completed = models.BooleanField(default=False)
    success = models.BooleanField(null=True, blank=True)
    message = models.TextField(blank=True)
    error_code = models.CharField(max_length=50, blank=True)
    traceback = models.TextField(blank=True)
    result = models.JSONField(null=True, blank=True)
    retry_count = models.IntegerField(default=0)
    celery_task_id = models.CharField(max_length=255, blank=True)
    worker = models.CharField(max_length=255, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    fence = models.BigIntegerField(null=True, blank=True)
    lease_until = models.DateTimeField(
        null=True, blank=True,
        help_text="RUNNING: the lease's end; RETRYING: when the next attempt is due",
    )
    attempts = models.JSONField(
        db_default=models.Value([], output_field=models.JSONField()), blank=True,
        help_text="Every attempt once there were two or more: number, status, times, worker, fence, error",
    )
    republished = models.SmallIntegerField(
        db_default=0, help_text="How often the reconciler sent this execution's message again"
    )
    sentry_checkin_id = models.CharField(max_length=64, blank=True, db_default="")
    waiting_since = models.DateTimeField(
        null=True, blank=True,
        help_text="PENDING or RETRYING with no room (overlap skip, max_concurrency, its concurrency group): "
                  "when it began to wait (it runs when a run ends)",
    )
    due_at = models.DateTimeField(
        null=True, blank=True, help_text="A scheduled slot: when it was due to be sent (the slot plus its jitter)",
    )
    # Jobs declared with after=: the upstream execution whose end created this one (its success,
    # or the failure or skip that stopped the chain here). Not a foreign key: retention may delete it.
    upstream_execution_id = models.BigIntegerField(
        null=True, blank=True, help_text="The upstream job's execution of this slot that created this one",
    )
    cascade = models.BooleanField(
        db_default=False, help_text="Re-run with --cascade: its success runs the downstream jobs' slot again",
    )
    late_alerted = models.BooleanField(
        db_default=False, help_text="Its LATE alert was recorded (it had not started by the job's start_deadline)",
    )
    long_alerted = models.BooleanField(
        db_default=False, help_text="Its LONG_RUNNING alert was recorded (still running past the job's max_runtime)",
    )
    # Runs with parameters: what the body runs with is read from here, never from a message.
    params = models.JSONField(
        null=True, blank=True, help_text="The parameter values it runs with (dates as ISO strings); the parameters "
                                         "left out take their declared defaults; empty = none given",
    )
    params_given = models.BooleanField(
        db_default=False, help_text="A run with parameters a person gave (--param, the admin, the API): its own "
                                    "execution, neither the slot's regular run nor skipped because the slot ran",
    )

    class Meta:
        ordering = ["-slot", "-run_number"]
        verbose_name = "cron execution"
        constraints = [
            models.UniqueConstraint(
                fields=["job", "slot", "run_number"], name="cron_execution_once_per_run"
            ),
        ]
        indexes = [
            models.Index(fields=["task_code", "execution_date"], name="cron_exec_code_date"),
            models.Index(
                fields=["task_code", "success", "execution_date"], name="cron_exec_code_ok_date"
            ),
            models.Index(fields=["completed"], name="cron_exec_completed"),
            models.Index(fields=["job", "status"], name="cron_exec_job_status"),
            # One-off runs recorded ahead and not sent yet: what the beat's idle tick looks for.
            models.Index(fields=["due_at"], name="cron_exec_one_off_due",
                         condition=models.Q(trigger="ONE_OFF", status="PENDING", celery_task_id="")),
            # What the reconciler's timing checks scan: runs not started, or running, not alerted yet.
            models.Index(fields=["job"], name="cron_exec_late_unalerted",
                         condition=models.Q(status="PENDING", late_alerted=False)),
            models.Index(fields=["job"], name="cron_exec_long_unalerted",
                         condition=models.Q(status="RUNNING", long_alerted=False)),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} {self.slot:%Y-%m-%d %H:%M} #{self.run_number} {self.status}"

    @property
    def duration(self) -> dt.timedelta | None:
        if self.started and self.ended:
            return self.ended - self.started
        return None


class Alert(models.Model):
    """The outbox: one notification of one event of an execution on one channel.

    Written in the same transaction as the state change that causes it, delivered by the
    ``cron_celery.deliver_alert`` task, and sent again by the reconciler while PENDING.
    """

    execution = models.ForeignKey(CronExecution, on_delete=models.CASCADE, related_name="alerts")
    job = models.ForeignKey(CronJob, on_delete=models.CASCADE, related_name="alerts")
    event = models.CharField(max_length=20, choices=Event.choices())
    channel = models.CharField(max_length=200)
    status = models.CharField(max_length=10, choices=AlertStatus.choices(), default=AlertStatus.PENDING.value)
    attempts = models.IntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    sent_at = models.DateTimeField(null=True, blank=True)
    facts = models.JSONField(
        db_default=models.Value({}, output_field=models.JSONField()), blank=True,
        help_text="What a timing alert was decided on: when a late run was due (due), when a long attempt "
                  "started (started), how long a fast body took (runtime, seconds); empty for the others",
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["execution", "event", "channel"], name="cron_alert_once"),
        ]
        indexes = [
            models.Index(fields=["updated_at"], name="cron_alert_pending",
                         condition=models.Q(status="PENDING")),
            # The alerts given up on, by channel, and when: what ``/cron/metrics/`` reads at every scrape.
            models.Index(fields=["channel", "updated_at"], name="cron_alert_failed",
                         condition=models.Q(status="FAILED")),
        ]

    def __str__(self) -> str:
        return f"{self.event} of execution {self.execution_id} on {self.channel}: {self.status}"


class CronDependency(models.Model):
    """One edge of ``after=``: the downstream job runs a slot once all its upstream jobs succeeded
    in it. Written from the declarations (``dependencies.sync``); read by the database trigger
    that decides the downstream's slot in the transaction of an upstream's final write."""

    downstream = models.ForeignKey(CronJob, on_delete=models.CASCADE, related_name="upstream_edges")
    upstream = models.ForeignKey(CronJob, on_delete=models.CASCADE, related_name="downstream_edges")

    class Meta:
        verbose_name = "cron dependency"
        constraints = [models.UniqueConstraint(fields=["upstream", "downstream"], name="cron_dependency_once")]

    def __str__(self) -> str:
        return f"{self.downstream_id} after {self.upstream_id}"


class BeatHeartbeat(models.Model):
    """One row per beat process: whether it leads, and when it was last seen (for health)."""

    identity = models.CharField(max_length=200, unique=True, help_text="host:pid")
    leading = models.BooleanField(default=False)
    started_at = models.DateTimeField(db_default=Now())
    seen_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-seen_at"]

    def __str__(self) -> str:
        return f"{self.identity} ({'leader' if self.leading else 'standby'})"


class Lease(models.Model):
    """A named lease on the database clock (``leadership``): ``beat`` is the beat leader's,
    ``reconciler`` the running reconciler pass's. The process that wrote ``token`` holds it
    until ``lease_until``, as PostgreSQL's clock tells."""

    name = models.CharField(max_length=50, primary_key=True)
    holder = models.CharField(max_length=200, help_text="host:pid")
    token = models.CharField(max_length=64)
    lease_until = models.DateTimeField()
    since = models.DateTimeField(help_text="When this holder took it")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}: {self.holder} until {self.lease_until:%Y-%m-%d %H:%M:%S}"


class ScheduleChange(models.Model):
    """One change of a job's schedule, timezone, enabled/paused state, parameters (kwargs), active
    window or concurrency: written by database triggers (``migrations/_initial/audit.py``) in the transaction of the
    change, whatever made it — an admin form or action, a deploy, the beat, the ORM or raw SQL.
    One row per job per statement; read-only everywhere (``audit``)."""

    # No constraint Django would manage: the initial migration adds one with ON DELETE SET NULL, so the
    # rows outlive their job (even one deleted by raw SQL) and keep its name and code.
    job = models.ForeignKey(CronJob, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
                            related_name="schedule_changes", db_index=False,  # the index below leads with it
                            help_text="Empty once the job is deleted")
    job_name = models.CharField(max_length=100, help_text="The job's name when it changed")
    job_code = models.CharField(max_length=50, help_text="The job's code when it changed")
    changed_at = models.DateTimeField(db_default=Now(),
                                      help_text="When, by the database's clock (the statement's start)")
    actor = models.CharField(max_length=150, blank=True, db_default="",
                             help_text="The person (an admin user's name), when the code that made the change knew one")
    db_role = models.CharField(max_length=63, help_text="The database role that made the change (current_user)")
    application_name = models.CharField(max_length=64, blank=True, db_default="",
                                        help_text="The connection's application_name")
    source = models.CharField(max_length=100, help_text='Where from: "admin: change form", "deploy (...)", '
                                                        '"beat (one_off)", ... or "database" when nobody said')
    changes = models.JSONField(help_text='Each changed attribute as [before, after]: {"schedule": '
                                         '["0 * * * *", "*/5 * * * *"], "enabled": [true, false]}')

    class Meta:
        ordering = ["-id"]
        verbose_name = "schedule change"
        indexes = [
            # A job's changes, newest first (its admin page, the endpoint's job=).
            models.Index(fields=["job", "-id"], name="cron_change_job_newest"),
            # The retention's purge and the endpoint's since=.
            models.Index(fields=["changed_at"], name="cron_change_at"),
        ]

    def __str__(self) -> str:
        return f"{self.job_name} at {self.changed_at:%Y-%m-%d %H:%M:%S}: {', '.join(self.changes or {})}"


# The counters and rollups kept by the database's triggers, defined in ``cron_celery.counts``: they
# are models of this app, importable from here as every model is.
from cron_celery.counts import ROLLUP_DAYS, Durations, Hour, Tally  # noqa: E402

__all__ += ["ROLLUP_DAYS", "Durations", "Hour"]
