# The audit log of schedule changes (cron_celery.audit): a row per job per statement that changes
# its schedule, timezone, enabled/paused state, parameters (kwargs), active window or concurrency,
# written by triggers in the transaction of the change, whatever made it (an admin form or action,
# a deploy, the beat, the ORM or raw SQL).
#
# Each attribute is recorded once, at its source of truth:
# - the periodic task: enabled, its crontab/interval/solar/clocked link, kwargs, start_time and
#   expires (the active window), one_off;
# - the schedule rows themselves: a crontab (fields or timezone), interval, solar or clocked row
#   edited in place changes every job whose task uses it, one row each;
# - the job row: what is declared in code only (max_concurrency, concurrency_group, and its timezone
#   when no crontab carries one), its link to a periodic task, and paused where it is set directly.
# The copies are not recorded again: 0003's trigger pausing the job of a disabled task runs at
# trigger depth 2 (the job's trigger records paused only at depth 1), and schedule_sync.apply_edits
# copies nothing this trigger watches but a pause it decides itself (an edit, of the schedule or the
# parameters, that cannot drive the job; or a usable one again), recorded as such.
#
# Who: the transaction-local settings cron_celery.actor and cron_celery.source (audit.set_author),
# else the source 'database'; always the role (current_user) and the connection's application_name.
# A role that edits schedules needs INSERT on the audit table: without it its edit fails, so no
# change goes unrecorded.

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

JOB = "cron_celery_cronjob"
TASK = "django_celery_beat_periodictask"
CRONTAB = "django_celery_beat_crontabschedule"
INTERVAL = "django_celery_beat_intervalschedule"
SOLAR = "django_celery_beat_solarschedule"
CLOCKED = "django_celery_beat_clockedschedule"
AUDIT = "cron_celery_schedulechange"

# The columns of the periodic task this audit watches: the same as those whose edit the job's edit
# trigger follows (0003, 0018, 0020: it bumps the job's schedule_version and sets paused = NOT enabled).
_WATCHED = ("enabled", "crontab_id", "interval_id", "solar_id", "clocked_id", "start_time", "expires", "one_off",
            "kwargs")


def _any_changed(columns: tuple[str, ...]) -> str:
    return " OR ".join(f"OLD.{column} IS DISTINCT FROM NEW.{column}" for column in columns)


def _state(row: str) -> str:
    """A periodic task's attributes, from OLD or NEW."""
    return (f"cron_celery_audit_state({row}.enabled, {row}.crontab_id, {row}.interval_id, {row}.solar_id,"
            f" {row}.clocked_id, {row}.kwargs, {row}.start_time, {row}.expires, {row}.one_off, job.timezone)")


def _in_place(table: str, link: str, text: str, extra: str = "") -> str:
    """The trigger of a schedule row edited in place: a row for each job whose task uses it."""
    name = f"cron_celery_audit_{table.rsplit('_', 1)[1]}"
    before = f"jsonb_build_object('schedule', {text.format(row='OLD')}{extra.format(row='OLD')})"
    after = f"jsonb_build_object('schedule', {text.format(row='NEW')}{extra.format(row='NEW')})"
    return f"""
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cron_celery_audit_write(job.id, job.name, job.code, cron_celery_audit_diff({before}, {after}))
       FROM {JOB} AS job JOIN {TASK} AS task ON task.id = job.periodic_task_id
      WHERE task.{link} = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER {name} AFTER UPDATE ON {table} FOR EACH ROW
    WHEN (OLD IS DISTINCT FROM NEW) EXECUTE FUNCTION {name}();
"""


_IN_PLACE = "".join((
    _in_place(CRONTAB, "crontab_id", "cron_celery_audit_cron({row}.minute, {row}.hour, {row}.day_of_month,"
                                     " {row}.month_of_year, {row}.day_of_week)", ", 'timezone', {row}.timezone::text"),
    _in_place(INTERVAL, "interval_id", "cron_celery_audit_interval({row}.every, {row}.period)"),
    _in_place(SOLAR, "solar_id", "cron_celery_audit_solar({row}.event, {row}.latitude, {row}.longitude)"),
    _in_place(CLOCKED, "clocked_id", "cron_celery_audit_clocked({row}.clocked_time)"),
))
_TASK_STATES = f"{_state('OLD')}, {_state('NEW')}"

FORWARD = f"""
ALTER TABLE {AUDIT} ADD CONSTRAINT cron_change_job_fk FOREIGN KEY (job_id) REFERENCES {JOB} (id) ON DELETE SET NULL;

-- Schedules as people read them, and as the job row's schedule column has them.
CREATE FUNCTION cron_celery_audit_cron(minute text, hour text, dom text, moy text, dow text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT concat_ws(' ', minute, hour, dom, moy, dow) $$;

CREATE FUNCTION cron_celery_audit_interval(every integer, period text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'every ' || CASE period WHEN 'days' THEN (every::bigint * 86400)::text || 's'
                                   WHEN 'hours' THEN (every::bigint * 3600)::text || 's'
                                   WHEN 'minutes' THEN (every::bigint * 60)::text || 's'
                                   WHEN 'seconds' THEN every::text || 's'
                                   ELSE every::text || ' ' || period END
$$;

-- An instant in UTC, ISO 8601, its fraction of a second only when it has one.
CREATE FUNCTION cron_celery_audit_time(at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT rtrim(rtrim(to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '0'), '.') || 'Z'
$$;

CREATE FUNCTION cron_celery_audit_solar(event text, latitude numeric, longitude numeric) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'solar ' || event || ' at ' || trim_scale(latitude)::text || ', ' || trim_scale(longitude)::text
$$;

CREATE FUNCTION cron_celery_audit_clocked(at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'clocked at ' || cron_celery_audit_time(at) $$;

-- The parameters as JSON, compared as JSON (a form that re-spaces them changes nothing); text
-- that is no JSON is kept as a string.
CREATE FUNCTION cron_celery_audit_json(value text) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN value::jsonb;
EXCEPTION WHEN others THEN
    RETURN to_jsonb(value);
END $$;

-- A periodic task's attributes, as the audit names them. (The functions that run queries are
-- PL/pgSQL, whose plans are kept per session; a SQL function's would be made again at each call.)
CREATE FUNCTION cron_celery_audit_state(enabled boolean, crontab_id bigint, interval_id bigint, solar_id bigint,
                                        clocked_id bigint, kwargs text, start_time timestamptz,
                                        expires timestamptz, one_off boolean, job_timezone text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    schedule text;
    zone text;
BEGIN
    IF crontab_id IS NOT NULL THEN
        SELECT cron_celery_audit_cron(c.minute, c.hour, c.day_of_month, c.month_of_year, c.day_of_week),
               c.timezone::text
          INTO schedule, zone FROM {CRONTAB} AS c WHERE c.id = crontab_id;
    ELSIF interval_id IS NOT NULL THEN
        SELECT cron_celery_audit_interval(i.every, i.period) INTO schedule FROM {INTERVAL} AS i WHERE i.id = interval_id;
    ELSIF solar_id IS NOT NULL THEN
        SELECT cron_celery_audit_solar(s.event, s.latitude, s.longitude) INTO schedule
          FROM {SOLAR} AS s WHERE s.id = solar_id;
    ELSIF clocked_id IS NOT NULL THEN
        SELECT cron_celery_audit_clocked(k.clocked_time) INTO schedule FROM {CLOCKED} AS k WHERE k.id = clocked_id;
    END IF;
    RETURN jsonb_build_object(
        'schedule', schedule, 'timezone', coalesce(zone, job_timezone), 'enabled', enabled,
        'kwargs', cron_celery_audit_json(kwargs), 'active_from', cron_celery_audit_time(start_time),
        'active_until', cron_celery_audit_time(expires), 'one_off', one_off);
END $$;

CREATE FUNCTION cron_celery_audit_task_state(task_id bigint, job_timezone text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    task record;
BEGIN
    SELECT t.enabled, t.crontab_id, t.interval_id, t.solar_id, t.clocked_id, t.kwargs, t.start_time, t.expires,
           t.one_off
      INTO task FROM {TASK} AS t WHERE t.id = task_id;
    IF NOT FOUND THEN
        RETURN '{{}}'::jsonb;
    END IF;
    RETURN cron_celery_audit_state(task.enabled, task.crontab_id, task.interval_id, task.solar_id, task.clocked_id,
                                   task.kwargs, task.start_time, task.expires, task.one_off, job_timezone);
END $$;

-- {{"attribute": [before, after]}} for each attribute that differs (a missing one is null).
CREATE FUNCTION cron_celery_audit_diff(before jsonb, after jsonb) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(key, jsonb_build_array(coalesce(before -> key, 'null'::jsonb),
                                                                    coalesce(after -> key, 'null'::jsonb))), '{{}}'::jsonb)
              FROM jsonb_object_keys(coalesce(before, '{{}}'::jsonb) || coalesce(after, '{{}}'::jsonb)) AS key
             WHERE coalesce(before -> key, 'null'::jsonb) IS DISTINCT FROM coalesce(after -> key, 'null'::jsonb));
END $$;

-- The row, with who: the person and where from when the transaction said (audit.set_author), the
-- role and the connection's application_name always. Nothing when nothing changed.
CREATE FUNCTION cron_celery_audit_write(p_job bigint, p_name text, p_code text, p_changes jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_changes IS NULL OR p_changes = '{{}}'::jsonb THEN
        RETURN;
    END IF;
    INSERT INTO {AUDIT} (job_id, job_name, job_code, changed_at, actor, db_role, application_name, source, changes)
    VALUES (p_job, left(p_name, 100), left(p_code, 50), statement_timestamp(),
            left(coalesce(current_setting('cron_celery.actor', true), ''), 150), left(current_user::text, 63),
            left(coalesce(current_setting('application_name', true), ''), 64),
            left(coalesce(nullif(current_setting('cron_celery.source', true), ''), 'database'), 100), p_changes);
END $$;

-- The periodic task. This trigger fires before cron_celery_periodic_task_edited (triggers of one
-- event fire in the order of their names), which fires on the same columns and sets the job's
-- paused to NOT enabled; so the job row still holds its flag here: when that flag was out of step
-- with enabled (the job paused for a schedule problem) and the edit moves it without changing
-- enabled, the row says so too.
CREATE FUNCTION cron_celery_audit_task() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    job record;
    changes jsonb;
BEGIN
    SELECT id, name, code, paused, timezone INTO job FROM {JOB} WHERE periodic_task_id = NEW.id;
    IF NOT FOUND THEN
        RETURN NULL;  -- not a cron_celery job's task
    END IF;
    changes := cron_celery_audit_diff({_TASK_STATES});
    IF OLD.enabled IS NOT DISTINCT FROM NEW.enabled AND job.paused IS DISTINCT FROM NOT NEW.enabled THEN
        changes := changes || jsonb_build_object('paused', jsonb_build_array(job.paused, NOT NEW.enabled));
    END IF;
    PERFORM cron_celery_audit_write(job.id, job.name, job.code, changes);
    RETURN NULL;
END $$;
CREATE TRIGGER cron_celery_audit_task AFTER UPDATE ON {TASK} FOR EACH ROW
    WHEN ({_any_changed(_WATCHED)})
    EXECUTE FUNCTION cron_celery_audit_task();

-- The job row: what only the code declares, the link to a periodic task, and paused set directly
-- (at trigger depth 1: not 0003's copy of a task's enabled, recorded at the task).
CREATE FUNCTION cron_celery_audit_job() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changes jsonb := '{{}}'::jsonb;
BEGIN
    IF OLD.paused IS DISTINCT FROM NEW.paused AND pg_trigger_depth() = 1 THEN
        changes := changes || jsonb_build_object('paused', jsonb_build_array(OLD.paused, NEW.paused));
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
                   (SELECT name FROM {TASK} WHERE id = OLD.periodic_task_id),
                   (SELECT name FROM {TASK} WHERE id = NEW.periodic_task_id)));
    ELSIF OLD.timezone IS DISTINCT FROM NEW.timezone
          AND NOT EXISTS (SELECT 1 FROM {TASK} WHERE id = NEW.periodic_task_id AND crontab_id IS NOT NULL) THEN
        -- A crontab carries its own timezone (a change of it is a change of the task's crontab).
        changes := changes || jsonb_build_object('timezone', jsonb_build_array(OLD.timezone, NEW.timezone));
    END IF;
    PERFORM cron_celery_audit_write(NEW.id, NEW.name, NEW.code, changes);
    RETURN NULL;
END $$;
CREATE TRIGGER cron_celery_audit_job AFTER UPDATE ON {JOB} FOR EACH ROW
    WHEN (OLD.paused IS DISTINCT FROM NEW.paused OR OLD.max_concurrency IS DISTINCT FROM NEW.max_concurrency
          OR OLD.concurrency_group IS DISTINCT FROM NEW.concurrency_group OR OLD.timezone IS DISTINCT FROM NEW.timezone
          OR OLD.periodic_task_id IS DISTINCT FROM NEW.periodic_task_id)
    EXECUTE FUNCTION cron_celery_audit_job();
{_IN_PLACE}
"""

BACKWARD = f"""
DROP TRIGGER IF EXISTS cron_celery_audit_task ON {TASK};
DROP TRIGGER IF EXISTS cron_celery_audit_job ON {JOB};
DROP TRIGGER IF EXISTS cron_celery_audit_crontabschedule ON {CRONTAB};
DROP TRIGGER IF EXISTS cron_celery_audit_intervalschedule ON {INTERVAL};
DROP TRIGGER IF EXISTS cron_celery_audit_solarschedule ON {SOLAR};
DROP TRIGGER IF EXISTS cron_celery_audit_clockedschedule ON {CLOCKED};
DROP FUNCTION IF EXISTS cron_celery_audit_task();
DROP FUNCTION IF EXISTS cron_celery_audit_job();
DROP FUNCTION IF EXISTS cron_celery_audit_crontabschedule();
DROP FUNCTION IF EXISTS cron_celery_audit_intervalschedule();
DROP FUNCTION IF EXISTS cron_celery_audit_solarschedule();
DROP FUNCTION IF EXISTS cron_celery_audit_clockedschedule();
DROP FUNCTION IF EXISTS cron_celery_audit_write(bigint, text, text, jsonb);
DROP FUNCTION IF EXISTS cron_celery_audit_diff(jsonb, jsonb);
DROP FUNCTION IF EXISTS cron_celery_audit_task_state(bigint, text);
DROP FUNCTION IF EXISTS cron_celery_audit_state(boolean, bigint, bigint, bigint, bigint, text, timestamptz,
                                                timestamptz, boolean, text);
DROP FUNCTION IF EXISTS cron_celery_audit_json(text);
DROP FUNCTION IF EXISTS cron_celery_audit_clocked(timestamptz);
DROP FUNCTION IF EXISTS cron_celery_audit_solar(text, numeric, numeric);
DROP FUNCTION IF EXISTS cron_celery_audit_time(timestamptz);
DROP FUNCTION IF EXISTS cron_celery_audit_interval(integer, text);
DROP FUNCTION IF EXISTS cron_celery_audit_cron(text, text, text, text, text);
ALTER TABLE {AUDIT} DROP CONSTRAINT IF EXISTS cron_change_job_fk;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("cron_celery", "0020_run_parameters"),
        ("django_celery_beat", "0018_improve_crontab_helptext"),
    ]

    operations = [
        migrations.CreateModel(
            name='ScheduleChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job_name', models.CharField(help_text="The job's name when it changed", max_length=100)),
                ('job_code', models.CharField(help_text="The job's code when it changed", max_length=50)),
                ('changed_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), help_text="When, by the database's clock (the statement's start)")),
                ('actor', models.CharField(blank=True, db_default='', help_text="The person (an admin user's name), when the code that made the change knew one", max_length=150)),
                ('db_role', models.CharField(help_text='The database role that made the change (current_user)', max_length=63)),
                ('application_name', models.CharField(blank=True, db_default='', help_text="The connection's application_name", max_length=64)),
                ('source', models.CharField(help_text='Where from: "admin: change form", "deploy (...)", "beat (one_off)", ... or "database" when nobody said', max_length=100)),
                ('changes', models.JSONField(help_text='Each changed attribute as [before, after]: {"schedule": ["0 * * * *", "*/5 * * * *"], "enabled": [true, false]}')),
                ('job', models.ForeignKey(blank=True, db_constraint=False, db_index=False, help_text='Empty once the job is deleted', null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='schedule_changes', to='cron_celery.cronjob')),
            ],
            options={
                'verbose_name': 'schedule change',
                'ordering': ['-id'],
                'indexes': [models.Index(fields=['job', '-id'], name='cron_change_job_newest'), models.Index(fields=['changed_at'], name='cron_change_at')],
            },
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
