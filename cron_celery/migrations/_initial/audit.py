"""The audit log of schedule changes, written by the database (part of ``0001_initial``; never edit it,
a change is a new migration).

Triggers on the job rows and on django-celery-beat's periodic tasks and schedules write one
``cron_celery_schedulechange`` row per change, whoever made it (the admin, a deploy, a shell, plain
SQL): the schedule and state before and after, in words people read, with the author the session
set (``cron_celery.audit.set_author``) and the database role that made it. A change of a job row that
is removed keeps its audit rows (their ``job_id`` becomes NULL).
"""

FORWARD = """
-- A job row deleted keeps its audit rows: their job_id becomes NULL.
ALTER TABLE cron_celery_schedulechange ADD CONSTRAINT cron_change_job_fk
    FOREIGN KEY (job_id) REFERENCES cron_celery_cronjob (id) ON DELETE SET NULL;

CREATE OR REPLACE FUNCTION cron_celery_audit_cron(minute text, hour text, dom text, moy text, dow text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$ SELECT concat_ws(' ', minute, hour, dom, moy, dow) $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_interval(every integer, period text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT 'every ' || CASE period WHEN 'days' THEN (every::bigint * 86400)::text || 's'
                                   WHEN 'hours' THEN (every::bigint * 3600)::text || 's'
                                   WHEN 'minutes' THEN (every::bigint * 60)::text || 's'
                                   WHEN 'seconds' THEN every::text || 's'
                                   ELSE every::text || ' ' || period END
$function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_time(at timestamp with time zone)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT rtrim(rtrim(to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '0'), '.') || 'Z'
$function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_solar(event text, latitude numeric, longitude numeric)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT 'solar ' || event || ' at ' || trim_scale(latitude)::text || ', ' || trim_scale(longitude)::text
$function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_clocked(at timestamp with time zone)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$ SELECT 'clocked at ' || cron_celery_audit_time(at) $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_json(value text)
 RETURNS jsonb
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
BEGIN
    RETURN value::jsonb;
EXCEPTION WHEN others THEN
    RETURN to_jsonb(value);
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_state(enabled boolean, crontab_id bigint, interval_id bigint, solar_id bigint, clocked_id bigint, kwargs text, start_time timestamp with time zone, expires timestamp with time zone, one_off boolean, job_timezone text)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    schedule text;
    zone text;
BEGIN
    IF crontab_id IS NOT NULL THEN
        SELECT cron_celery_audit_cron(c.minute, c.hour, c.day_of_month, c.month_of_year, c.day_of_week),
               c.timezone::text
          INTO schedule, zone FROM django_celery_beat_crontabschedule AS c WHERE c.id = crontab_id;
    ELSIF interval_id IS NOT NULL THEN
        SELECT cron_celery_audit_interval(i.every, i.period) INTO schedule FROM django_celery_beat_intervalschedule AS i WHERE i.id = interval_id;
    ELSIF solar_id IS NOT NULL THEN
        SELECT cron_celery_audit_solar(s.event, s.latitude, s.longitude) INTO schedule
          FROM django_celery_beat_solarschedule AS s WHERE s.id = solar_id;
    ELSIF clocked_id IS NOT NULL THEN
        SELECT cron_celery_audit_clocked(k.clocked_time) INTO schedule FROM django_celery_beat_clockedschedule AS k WHERE k.id = clocked_id;
    END IF;
    RETURN jsonb_build_object(
        'schedule', schedule, 'timezone', coalesce(zone, job_timezone), 'enabled', enabled,
        'kwargs', cron_celery_audit_json(kwargs), 'active_from', cron_celery_audit_time(start_time),
        'active_until', cron_celery_audit_time(expires), 'one_off', one_off);
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_task_state(task_id bigint, job_timezone text)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    task record;
BEGIN
    SELECT t.enabled, t.crontab_id, t.interval_id, t.solar_id, t.clocked_id, t.kwargs, t.start_time, t.expires,
           t.one_off
      INTO task FROM django_celery_beat_periodictask AS t WHERE t.id = task_id;
    IF NOT FOUND THEN
        RETURN '{}'::jsonb;
    END IF;
    RETURN cron_celery_audit_state(task.enabled, task.crontab_id, task.interval_id, task.solar_id, task.clocked_id,
                                   task.kwargs, task.start_time, task.expires, task.one_off, job_timezone);
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_diff(before jsonb, after jsonb)
 RETURNS jsonb
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(key, jsonb_build_array(coalesce(before -> key, 'null'::jsonb),
                                                                    coalesce(after -> key, 'null'::jsonb))), '{}'::jsonb)
              FROM jsonb_object_keys(coalesce(before, '{}'::jsonb) || coalesce(after, '{}'::jsonb)) AS key
             WHERE coalesce(before -> key, 'null'::jsonb) IS DISTINCT FROM coalesce(after -> key, 'null'::jsonb));
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_write(p_job bigint, p_name text, p_code text, p_changes jsonb)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_changes IS NULL OR p_changes = '{}'::jsonb THEN
        RETURN;
    END IF;
    INSERT INTO cron_celery_schedulechange (job_id, job_name, job_code, changed_at, actor, db_role, application_name, source, changes)
    VALUES (p_job, left(p_name, 100), left(p_code, 50), statement_timestamp(),
            left(coalesce(current_setting('cron_celery.actor', true), ''), 150), left(current_user::text, 63),
            left(coalesce(current_setting('application_name', true), ''), 64),
            left(coalesce(nullif(current_setting('cron_celery.source', true), ''), 'database'), 100), p_changes);
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_task()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    job record;
    changes jsonb;
BEGIN
    SELECT id, name, code, paused, timezone INTO job FROM cron_celery_cronjob WHERE periodic_task_id = NEW.id;
    IF NOT FOUND THEN
        RETURN NULL;  -- not a cron_celery job's task
    END IF;
    changes := cron_celery_audit_diff(cron_celery_audit_state(OLD.enabled, OLD.crontab_id, OLD.interval_id, OLD.solar_id, OLD.clocked_id, OLD.kwargs, OLD.start_time, OLD.expires, OLD.one_off, job.timezone), cron_celery_audit_state(NEW.enabled, NEW.crontab_id, NEW.interval_id, NEW.solar_id, NEW.clocked_id, NEW.kwargs, NEW.start_time, NEW.expires, NEW.one_off, job.timezone));
    IF OLD.enabled IS NOT DISTINCT FROM NEW.enabled AND job.paused IS DISTINCT FROM NOT NEW.enabled THEN
        changes := changes || jsonb_build_object('paused', jsonb_build_array(job.paused, NOT NEW.enabled));
    END IF;
    PERFORM cron_celery_audit_write(job.id, job.name, job.code, changes);
    RETURN NULL;
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_job()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    changes jsonb := '{}'::jsonb;
BEGIN
    IF OLD.paused IS DISTINCT FROM NEW.paused AND pg_trigger_depth() = 1 THEN
        changes := changes || jsonb_build_object('paused', jsonb_build_array(OLD.paused, NEW.paused));
    END IF;
    IF (OLD.removed_at IS NULL) IS DISTINCT FROM (NEW.removed_at IS NULL) THEN
        changes := changes || jsonb_build_object('declared', jsonb_build_array(OLD.removed_at IS NULL,
                                                                               NEW.removed_at IS NULL));
    END IF;
    IF OLD.max_concurrency IS DISTINCT FROM NEW.max_concurrency THEN
        changes := changes || jsonb_build_object('max_concurrency',
                                                 jsonb_build_array(OLD.max_concurrency, NEW.max_concurrency));
    END IF;
    IF OLD.concurrency_group IS DISTINCT FROM NEW.concurrency_group THEN
        changes := changes || jsonb_build_object('concurrency_group',
                                                 jsonb_build_array(OLD.concurrency_group, NEW.concurrency_group));
    END IF;
    IF OLD.periodic_task_id IS DISTINCT FROM NEW.periodic_task_id THEN
        changes := changes
            || cron_celery_audit_diff(cron_celery_audit_task_state(OLD.periodic_task_id, OLD.timezone),
                                      cron_celery_audit_task_state(NEW.periodic_task_id, NEW.timezone))
            || jsonb_build_object('periodic_task', jsonb_build_array(
                   (SELECT name FROM django_celery_beat_periodictask WHERE id = OLD.periodic_task_id),
                   (SELECT name FROM django_celery_beat_periodictask WHERE id = NEW.periodic_task_id)));
    ELSIF OLD.timezone IS DISTINCT FROM NEW.timezone
          AND NOT EXISTS (SELECT 1 FROM django_celery_beat_periodictask WHERE id = NEW.periodic_task_id AND crontab_id IS NOT NULL) THEN
        -- A crontab carries its own timezone (a change of it is a change of the task's crontab).
        changes := changes || jsonb_build_object('timezone', jsonb_build_array(OLD.timezone, NEW.timezone));
    END IF;
    PERFORM cron_celery_audit_write(NEW.id, NEW.name, NEW.code, changes);
    RETURN NULL;
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_crontabschedule()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM cron_celery_audit_write(job.id, job.name, job.code, cron_celery_audit_diff(jsonb_build_object('schedule', cron_celery_audit_cron(OLD.minute, OLD.hour, OLD.day_of_month, OLD.month_of_year, OLD.day_of_week), 'timezone', OLD.timezone::text), jsonb_build_object('schedule', cron_celery_audit_cron(NEW.minute, NEW.hour, NEW.day_of_month, NEW.month_of_year, NEW.day_of_week), 'timezone', NEW.timezone::text)))
       FROM cron_celery_cronjob AS job JOIN django_celery_beat_periodictask AS task ON task.id = job.periodic_task_id
      WHERE task.crontab_id = NEW.id;
    RETURN NULL;
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_intervalschedule()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM cron_celery_audit_write(job.id, job.name, job.code, cron_celery_audit_diff(jsonb_build_object('schedule', cron_celery_audit_interval(OLD.every, OLD.period)), jsonb_build_object('schedule', cron_celery_audit_interval(NEW.every, NEW.period))))
       FROM cron_celery_cronjob AS job JOIN django_celery_beat_periodictask AS task ON task.id = job.periodic_task_id
      WHERE task.interval_id = NEW.id;
    RETURN NULL;
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_solarschedule()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM cron_celery_audit_write(job.id, job.name, job.code, cron_celery_audit_diff(jsonb_build_object('schedule', cron_celery_audit_solar(OLD.event, OLD.latitude, OLD.longitude)), jsonb_build_object('schedule', cron_celery_audit_solar(NEW.event, NEW.latitude, NEW.longitude))))
       FROM cron_celery_cronjob AS job JOIN django_celery_beat_periodictask AS task ON task.id = job.periodic_task_id
      WHERE task.solar_id = NEW.id;
    RETURN NULL;
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_audit_clockedschedule()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM cron_celery_audit_write(job.id, job.name, job.code, cron_celery_audit_diff(jsonb_build_object('schedule', cron_celery_audit_clocked(OLD.clocked_time)), jsonb_build_object('schedule', cron_celery_audit_clocked(NEW.clocked_time))))
       FROM cron_celery_cronjob AS job JOIN django_celery_beat_periodictask AS task ON task.id = job.periodic_task_id
      WHERE task.clocked_id = NEW.id;
    RETURN NULL;
END $function$;

CREATE TRIGGER cron_celery_audit_clockedschedule AFTER UPDATE ON django_celery_beat_clockedschedule
    FOR EACH ROW WHEN ((old.* IS DISTINCT FROM new.*)) EXECUTE FUNCTION cron_celery_audit_clockedschedule();

CREATE TRIGGER cron_celery_audit_crontabschedule AFTER UPDATE ON django_celery_beat_crontabschedule
    FOR EACH ROW WHEN ((old.* IS DISTINCT FROM new.*)) EXECUTE FUNCTION cron_celery_audit_crontabschedule();

CREATE TRIGGER cron_celery_audit_intervalschedule AFTER UPDATE ON django_celery_beat_intervalschedule
    FOR EACH ROW WHEN ((old.* IS DISTINCT FROM new.*)) EXECUTE FUNCTION cron_celery_audit_intervalschedule();

CREATE TRIGGER cron_celery_audit_job AFTER UPDATE ON cron_celery_cronjob
    FOR EACH ROW WHEN (((old.paused IS DISTINCT FROM new.paused) OR (old.max_concurrency IS DISTINCT FROM new.max_concurrency) OR ((old.concurrency_group)::text IS DISTINCT FROM (new.concurrency_group)::text) OR ((old.timezone)::text IS DISTINCT FROM (new.timezone)::text) OR (old.periodic_task_id IS DISTINCT FROM new.periodic_task_id) OR ((old.removed_at IS NULL) IS DISTINCT FROM (new.removed_at IS NULL)))) EXECUTE FUNCTION cron_celery_audit_job();

CREATE TRIGGER cron_celery_audit_solarschedule AFTER UPDATE ON django_celery_beat_solarschedule
    FOR EACH ROW WHEN ((old.* IS DISTINCT FROM new.*)) EXECUTE FUNCTION cron_celery_audit_solarschedule();

CREATE TRIGGER cron_celery_audit_task AFTER UPDATE ON django_celery_beat_periodictask
    FOR EACH ROW WHEN (((old.enabled IS DISTINCT FROM new.enabled) OR (old.crontab_id IS DISTINCT FROM new.crontab_id) OR (old.interval_id IS DISTINCT FROM new.interval_id) OR (old.solar_id IS DISTINCT FROM new.solar_id) OR (old.clocked_id IS DISTINCT FROM new.clocked_id) OR (old.start_time IS DISTINCT FROM new.start_time) OR (old.expires IS DISTINCT FROM new.expires) OR (old.one_off IS DISTINCT FROM new.one_off) OR (old.kwargs IS DISTINCT FROM new.kwargs))) EXECUTE FUNCTION cron_celery_audit_task();
"""

BACKWARD = """
DROP FUNCTION IF EXISTS cron_celery_audit_clockedschedule() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_solarschedule() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_intervalschedule() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_crontabschedule() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_job() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_task() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_write(bigint,text,text,jsonb) CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_diff(jsonb,jsonb) CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_task_state(bigint,text) CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_state(boolean,bigint,bigint,bigint,bigint,text,timestamp with time zone,timestamp with time zone,boolean,text) CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_json(text) CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_clocked(timestamp with time zone) CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_solar(text,numeric,numeric) CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_time(timestamp with time zone) CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_interval(integer,text) CASCADE;
DROP FUNCTION IF EXISTS cron_celery_audit_cron(text,text,text,text,text) CASCADE;
ALTER TABLE cron_celery_schedulechange DROP CONSTRAINT IF EXISTS cron_change_job_fk;
"""
