"""The beat's view of admin edits, kept by the database (part of ``0001_initial``; never edit it, a change
is a new migration).

- An edit of a periodic task (enabled, its schedule, window, one_off or kwargs) or of the crontab or
  interval it uses bumps the job's ``schedule_version``: the beat takes the edit in at its next tick
  (``schedule_sync.apply_edits``). Disabling the task pauses the job and clears its next slot at once.
- ``cron_celery_job_due`` keeps ``due_at`` (the next slot plus the job's jitter) and ends the job's
  slots outside its active window, whoever writes the row.
"""

FORWARD = """
CREATE OR REPLACE FUNCTION cron_celery_periodic_task_edited()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE cron_celery_cronjob
       SET schedule_version = schedule_version + 1,
           paused = NOT NEW.enabled,
           next_run_at = CASE WHEN NEW.enabled THEN next_run_at END
     WHERE periodic_task_id = NEW.id;
    RETURN NULL;
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_crontab_edited()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE cron_celery_cronjob AS job SET schedule_version = job.schedule_version + 1
      FROM django_celery_beat_periodictask AS task
     WHERE task.crontab_id = NEW.id AND job.periodic_task_id = task.id;
    RETURN NULL;
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_interval_edited()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE cron_celery_cronjob AS job SET schedule_version = job.schedule_version + 1
      FROM django_celery_beat_periodictask AS task
     WHERE task.interval_id = NEW.id AND job.periodic_task_id = task.id;
    RETURN NULL;
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_job_due()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    NEW.due_at := CASE
        WHEN NEW.next_run_at IS NULL THEN NULL
        WHEN NEW.active_until IS NOT NULL AND NEW.next_run_at >= NEW.active_until THEN NULL
        ELSE greatest(NEW.next_run_at, NEW.active_from) + make_interval(secs => NEW.jitter_ms / 1000.0)
    END;
    RETURN NEW;
END $function$;

CREATE TRIGGER cron_celery_crontab_edited AFTER UPDATE ON django_celery_beat_crontabschedule
    FOR EACH ROW WHEN ((old.* IS DISTINCT FROM new.*)) EXECUTE FUNCTION cron_celery_crontab_edited();

CREATE TRIGGER cron_celery_interval_edited AFTER UPDATE ON django_celery_beat_intervalschedule
    FOR EACH ROW WHEN ((old.* IS DISTINCT FROM new.*)) EXECUTE FUNCTION cron_celery_interval_edited();

CREATE TRIGGER cron_celery_job_due BEFORE INSERT OR UPDATE OF next_run_at, jitter_ms, due_at, active_from, active_until ON cron_celery_cronjob
    FOR EACH ROW EXECUTE FUNCTION cron_celery_job_due();

CREATE TRIGGER cron_celery_periodic_task_edited AFTER UPDATE ON django_celery_beat_periodictask
    FOR EACH ROW WHEN (((old.enabled IS DISTINCT FROM new.enabled) OR (old.crontab_id IS DISTINCT FROM new.crontab_id) OR (old.interval_id IS DISTINCT FROM new.interval_id) OR (old.solar_id IS DISTINCT FROM new.solar_id) OR (old.clocked_id IS DISTINCT FROM new.clocked_id) OR (old.start_time IS DISTINCT FROM new.start_time) OR (old.expires IS DISTINCT FROM new.expires) OR (old.one_off IS DISTINCT FROM new.one_off) OR (old.kwargs IS DISTINCT FROM new.kwargs))) EXECUTE FUNCTION cron_celery_periodic_task_edited();
"""

BACKWARD = """
DROP FUNCTION IF EXISTS cron_celery_job_due() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_interval_edited() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_crontab_edited() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_periodic_task_edited() CASCADE;
"""
