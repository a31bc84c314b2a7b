# Active windows and one-off runs (and the alert event UPSTREAM of alert_on_upstream).
#
# A job's window in effect (active_from, active_until) and the periodic task's one_off are copied
# onto the job row when its periodic task is edited (start_time, expires and one_off now bump the
# job's schedule_version too). The due_at trigger (0016) learns the window: a job is not due before
# its window opens (due_at is at least active_from) and never once its next slot is at or past the
# window's end (due_at empty), so the beat's idle query stays one index probe.
#
# A one-off run is a PENDING execution (trigger ONE_OFF) recorded ahead with due_at = when to send
# it and no Celery task id; the beat finds the due ones through their own partial index and takes
# each once by giving it a task id. A one-off cancelled before it was sent (SKIPPED, CANCELLED)
# decides nothing for the jobs declared after= it: it was never a run of that slot.

import importlib

from django.db import migrations, models

JOB = "cron_celery_cronjob"
EXE = "cron_celery_cronexecution"
TASK = "django_celery_beat_periodictask"

_DEPENDENCIES = importlib.import_module("cron_celery.migrations.0017_dependencies")
_AFTER: str = _DEPENDENCIES.FORWARD[_DEPENDENCIES.FORWARD.index("CREATE FUNCTION cron_celery_after"):]
_AFTER = _AFTER[:_AFTER.index("END $$;") + len("END $$;")]
_SKIPS_KNOWN = "ended.skip_reason IN ('ALREADY_RAN', 'ALREADY_RUNNING')"
assert _SKIPS_KNOWN in _AFTER
_WINDOW_EDITED = """
          OR OLD.start_time IS DISTINCT FROM NEW.start_time
          OR OLD.expires IS DISTINCT FROM NEW.expires
          OR OLD.one_off IS DISTINCT FROM NEW.one_off"""


def _after(skip_reasons: str) -> str:
    return _AFTER.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION").replace(_SKIPS_KNOWN, skip_reasons)


def _task_trigger(extra: str) -> str:
    return f"""
DROP TRIGGER cron_celery_periodic_task_edited ON {TASK};
CREATE TRIGGER cron_celery_periodic_task_edited
    AFTER UPDATE ON {TASK} FOR EACH ROW
    WHEN (OLD.enabled IS DISTINCT FROM NEW.enabled
          OR OLD.crontab_id IS DISTINCT FROM NEW.crontab_id
          OR OLD.interval_id IS DISTINCT FROM NEW.interval_id
          OR OLD.solar_id IS DISTINCT FROM NEW.solar_id
          OR OLD.clocked_id IS DISTINCT FROM NEW.clocked_id{extra})
    EXECUTE FUNCTION cron_celery_periodic_task_edited();
"""


FORWARD = f"""
CREATE OR REPLACE FUNCTION cron_celery_job_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.due_at := CASE
        WHEN NEW.next_run_at IS NULL THEN NULL
        WHEN NEW.active_until IS NOT NULL AND NEW.next_run_at >= NEW.active_until THEN NULL
        ELSE greatest(NEW.next_run_at, NEW.active_from) + make_interval(secs => NEW.jitter_ms / 1000.0)
    END;
    RETURN NEW;
END $$;
DROP TRIGGER cron_celery_job_due ON {JOB};
CREATE TRIGGER cron_celery_job_due
    BEFORE INSERT OR UPDATE OF next_run_at, jitter_ms, due_at, active_from, active_until ON {JOB}
    FOR EACH ROW EXECUTE FUNCTION cron_celery_job_due();
{_task_trigger(_WINDOW_EDITED)}
{_after("ended.skip_reason IN ('ALREADY_RAN', 'ALREADY_RUNNING', 'CANCELLED')")}
UPDATE {JOB} SET active_from = task.start_time, active_until = task.expires, one_off = task.one_off
  FROM {TASK} AS task WHERE task.id = {JOB}.periodic_task_id
   AND (task.start_time IS NOT NULL OR task.expires IS NOT NULL OR task.one_off);
"""

# Back below 0018: a one-off not sent yet would look stranded to the older reconciler and go out at
# once, so it is cancelled (while CANCELLED still decides nothing downstream); a job whose window
# kept its due_at empty or late gets it back from next_run_at once the older trigger is in place.
BACKWARD = f"""
UPDATE {EXE} SET status = 'SKIPPED', skip_reason = 'CANCELLED', completed = true, ended = now(),
       message = 'Cancelled before it was sent: cron_celery was migrated back below 0018.'
 WHERE trigger = 'ONE_OFF' AND status = 'PENDING' AND celery_task_id = '';
CREATE OR REPLACE FUNCTION cron_celery_job_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.due_at := NEW.next_run_at + make_interval(secs => NEW.jitter_ms / 1000.0);
    RETURN NEW;
END $$;
DROP TRIGGER cron_celery_job_due ON {JOB};
CREATE TRIGGER cron_celery_job_due BEFORE INSERT OR UPDATE OF next_run_at, jitter_ms, due_at ON {JOB}
    FOR EACH ROW EXECUTE FUNCTION cron_celery_job_due();
{_task_trigger("")}
{_after(_SKIPS_KNOWN)}
UPDATE {JOB} SET due_at = NULL WHERE active_from IS NOT NULL OR active_until IS NOT NULL;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0017_dependencies'),
    ]

    operations = [
        migrations.AddField(
            model_name='cronjob',
            name='active_from',
            field=models.DateTimeField(blank=True, help_text='No slot before this is dispatched or recorded (UTC); empty = no start', null=True),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='active_until',
            field=models.DateTimeField(blank=True, help_text='No slot at or after this is dispatched or recorded (UTC); empty = no end', null=True),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='one_off',
            field=models.BooleanField(db_default=False, help_text="The periodic task's one_off: after one slot is sent, the job is paused"),
        ),
        migrations.AlterField(
            model_name='cronexecution',
            name='skip_reason',
            field=models.CharField(blank=True, choices=[('ALREADY_RAN', 'Slot already ran'), ('ALREADY_RUNNING', 'Slot is running'), ('OVERLAP', 'Job already running'), ('PAUSED', 'Job paused'), ('LOCK_UNAVAILABLE', 'Lock unavailable'), ('CONCURRENCY', 'Concurrency limit'), ('UPSTREAM', 'Upstream did not succeed'), ('CANCELLED', 'Cancelled')], max_length=20),
        ),
        migrations.AlterField(
            model_name='cronexecution',
            name='trigger',
            field=models.CharField(choices=[('BEAT', 'Beat'), ('MANUAL', 'Manual'), ('ENQUEUE', 'Enqueued'), ('ADMIN', 'Admin'), ('DIRECT', 'Direct call'), ('CATCH_UP', 'Catch-up'), ('BACKFILL', 'Backfill'), ('UPSTREAM', 'Upstream'), ('ONE_OFF', 'One-off')], default='BEAT', max_length=20),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(condition=models.Q(('celery_task_id', ''), ('status', 'PENDING'), ('trigger', 'ONE_OFF')), fields=['due_at'], name='cron_exec_one_off_due'),
        ),
        migrations.AlterField(
            model_name='alert',
            name='event',
            field=models.CharField(choices=[('FAILED', 'Failed'), ('TIMED_OUT', 'Timed out'), ('LOST', 'Lost'), ('MISSED', 'Missed'), ('RECOVERED', 'Recovered'), ('SUCCEEDED', 'Succeeded'), ('UPSTREAM', 'Upstream failed')], max_length=20),
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
