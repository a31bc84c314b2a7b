"""``manage.py reset_demo``: forget every recorded run, the beats and the queue.

Only for the demo's own database: it deletes every ``CronJob`` (with its executions and
alerts), the periodic tasks made for them, their schedule changes (the audit log), the beats'
heartbeats, the beat leader's lease and the messages waiting in the demo's queue.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django_celery_beat.models import PeriodicTask
from pottery import Redlock

from cron_celery import beat
from cron_celery.models import BeatHeartbeat, CronExecution, CronJob, ScheduleChange
from cron_celery.run import locks


class Command(BaseCommand):
    help = "Delete all cron jobs, executions, alerts and beats of this (demo) database and purge its queue."

    def handle(self, *args: Any, **options: Any) -> None:
        from celery import current_app

        executions = CronExecution.objects.count()
        # The periodic tasks first: sync_cron_schedules makes them again from the code.
        PeriodicTask.objects.filter(cron_job__isnull=False).delete()
        # Job rows are recreated from their declarations on the next run; ids keep growing,
        # so a stale message can never claim a new execution.
        CronJob.objects.all().delete()
        ScheduleChange.objects.all().delete()  # the jobs' audit log: this run's starts afresh
        BeatHeartbeat.objects.all().delete()
        lease = Redlock(key=beat.leader_key(), masters=locks.masters())
        for master in lease.masters:  # a beat killed last time may still hold the lease
            master.delete(lease.key)
        purged = current_app.control.purge()
        queue = current_app.conf.task_default_queue
        self.stdout.write(f"Deleted {executions} executions; purged {purged} messages from queue {queue!r}.")
