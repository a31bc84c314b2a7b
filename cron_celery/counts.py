"""The counters and rollups the database keeps as executions end (``migrations/_initial/counting.py``):
per job, final status and duration bucket for the metrics (``Tally``), and the dashboard's hours and
day-by-day success durations (``Hour``, ``Durations``). Read in O(jobs) rows, whatever the history."""

from __future__ import annotations

from django.db import models


class Tally(models.Model):
    """How many of a job's executions ended with ``status``, by duration bucket: counters kept by
    a trigger as executions reach a final status (``migrations/_initial/counting.py``), read by the metrics endpoint
    in one row per job, status and bucket — whatever the history's size. Purging history does
    not lower them."""

    job = models.ForeignKey("cron_celery.CronJob", on_delete=models.CASCADE, related_name="tallies")
    status = models.CharField(max_length=20)
    bucket = models.SmallIntegerField(
        help_text="Durations: the number of histogram bounds below them (-1: never started)")
    count = models.BigIntegerField(default=0)
    seconds = models.FloatField(default=0.0, help_text="The durations added up")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "status", "bucket"], name="cron_tally_once")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.status} bucket {self.bucket}: {self.count}"


#: The dashboard's rollups keep slots of this many days (it shows 7; the counting triggers' ``HORIZON``).
ROLLUP_DAYS = 8


class Hour(models.Model):
    """A job's finished executions of one hour of slots (UTC), kept by a trigger as executions
    reach a final status, follow their rows out when they are deleted, and are tidied once the
    hour is older than ``ROLLUP_DAYS``: the dashboard's 7-day success rate reads at most 169
    of them per job, however often the job runs (``migrations/_initial/counting.py``)."""

    job = models.ForeignKey("cron_celery.CronJob", on_delete=models.CASCADE, related_name="hours", db_index=False)
    hour = models.DateTimeField(help_text="The slots' hour (UTC)")
    ended = models.BigIntegerField(default=0, help_text="Executions of these slots in a final status")
    finished = models.BigIntegerField(default=0, help_text="Those not SKIPPED")
    succeeded = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "hour"], name="cron_hour_once")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.hour:%Y-%m-%d %H}h: {self.succeeded}/{self.finished}"


class Durations(models.Model):
    """How many of a job's successes of one day of slots (UTC) took a duration in ``bucket``: 32
    buckets a doubling from one millisecond (``dashboard.bucket_bounds``), kept like ``Hour``;
    the dashboard's 7-day median of a busy job is estimated from them."""

    job = models.ForeignKey("cron_celery.CronJob", on_delete=models.CASCADE, related_name="durations", db_index=False)
    day = models.DateField(help_text="The slots' day (UTC)")
    bucket = models.SmallIntegerField()
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "day", "bucket"], name="cron_durations_once")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.day} bucket {self.bucket}: {self.count}"
