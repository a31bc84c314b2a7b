# A pause with a note and an end, and a pause after repeated failures (issue: policies): five nullable or
# defaulted columns on the jobs table (a catalog change, no rewrite), a partial index of the pauses that
# end (built CONCURRENTLY), a trigger that clears the note whenever the job is resumed and dates the
# pause, the audit's job function, which now records the note and the end, and a new alert event (PAUSED).

from django.db import migrations, models

from cron_celery.migrations._initial import audit

JOB = "cron_celery_cronjob"


def _function(name: str) -> str:
    """The function ``name`` as 0001_initial made it (its text there is never edited)."""
    start = audit.FORWARD.index(f"CREATE OR REPLACE FUNCTION {name}(")
    return audit.FORWARD[start:audit.FORWARD.index("END $function$;", start) + len("END $function$;")]


def _replaced(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


AUDIT_JOB_BEFORE = _function("cron_celery_audit_job")
AUDIT_JOB_NOW = _replaced(
    AUDIT_JOB_BEFORE,
    "    IF OLD.max_concurrency IS DISTINCT FROM NEW.max_concurrency THEN\n",
    "    IF OLD.pause_note IS DISTINCT FROM NEW.pause_note THEN\n"
    "        changes := changes || jsonb_build_object('pause_note', jsonb_build_array(OLD.pause_note, NEW.pause_note));\n"
    "    END IF;\n"
    "    IF OLD.paused_until IS DISTINCT FROM NEW.paused_until THEN\n"
    "        changes := changes || jsonb_build_object('paused_until', jsonb_build_array(\n"
    "            cron_celery_audit_time(OLD.paused_until), cron_celery_audit_time(NEW.paused_until)));\n"
    "    END IF;\n"
    "    IF OLD.max_concurrency IS DISTINCT FROM NEW.max_concurrency THEN\n",
)
AUDIT_WHEN_BEFORE = (
    "((old.paused IS DISTINCT FROM new.paused) OR (old.max_concurrency IS DISTINCT FROM new.max_concurrency) OR "
    "((old.concurrency_group)::text IS DISTINCT FROM (new.concurrency_group)::text) OR "
    "((old.timezone)::text IS DISTINCT FROM (new.timezone)::text) OR "
    "(old.periodic_task_id IS DISTINCT FROM new.periodic_task_id) OR "
    "((old.removed_at IS NULL) IS DISTINCT FROM (new.removed_at IS NULL)))")
AUDIT_WHEN_NOW = AUDIT_WHEN_BEFORE[:-1] + (
    " OR (old.pause_note IS DISTINCT FROM new.pause_note) OR (old.paused_until IS DISTINCT FROM new.paused_until))")
assert f"FOR EACH ROW WHEN ({AUDIT_WHEN_BEFORE}) EXECUTE FUNCTION cron_celery_audit_job();" in audit.FORWARD


def _audit_trigger(when: str) -> str:
    return (f"DROP TRIGGER IF EXISTS cron_celery_audit_job ON {JOB};\n"
            f"CREATE TRIGGER cron_celery_audit_job AFTER UPDATE ON {JOB}\n"
            f"    FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION cron_celery_audit_job();\n")


PAUSE = f"""
CREATE OR REPLACE FUNCTION cron_celery_job_pause()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    -- Resumed, whoever resumed it (the admin, a periodic task's enabled, the pause's end, SQL): what was
    -- said of the pause goes with it. Paused: the pause is dated once, when it begins.
    IF NOT NEW.paused THEN
        NEW.pause_note := '';
        NEW.paused_by := '';
        NEW.paused_at := NULL;
        NEW.paused_until := NULL;
    ELSIF NOT OLD.paused OR NEW.paused_at IS NULL THEN
        NEW.paused_at := coalesce(NEW.paused_at, statement_timestamp());
    END IF;
    RETURN NEW;
END $function$;

DROP TRIGGER IF EXISTS cron_celery_job_pause ON {JOB};
CREATE TRIGGER cron_celery_job_pause BEFORE UPDATE OF paused, pause_note, paused_by, paused_at, paused_until
    ON {JOB} FOR EACH ROW EXECUTE FUNCTION cron_celery_job_pause();
"""
UNPAUSE = f"""
DROP TRIGGER IF EXISTS cron_celery_job_pause ON {JOB};
DROP FUNCTION IF EXISTS cron_celery_job_pause();
"""
COLUMNS = [
    ("pause_note", "text NOT NULL DEFAULT ''"),
    ("paused_by", "varchar(150) NOT NULL DEFAULT ''"),
    ("paused_at", "timestamp with time zone NULL"),
    ("paused_until", "timestamp with time zone NULL"),
    ("pause_after_failures", "integer NULL"),
]


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("cron_celery", "0005_catch_up_window")]

    operations = [
        migrations.RunSQL("SET lock_timeout = '2s'", "RESET lock_timeout"),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(f"ALTER TABLE {JOB} ADD COLUMN IF NOT EXISTS {name} {kind}",
                                  f"ALTER TABLE {JOB} DROP COLUMN IF EXISTS {name}")
                for name, kind in COLUMNS
            ],
            state_operations=[
                migrations.AddField(
                    model_name="cronjob", name="pause_note",
                    field=models.TextField(blank=True, db_default="", help_text="Why the job is paused; empty = no note"),
                ),
                migrations.AddField(
                    model_name="cronjob", name="paused_by",
                    field=models.CharField(
                        blank=True, db_default="", max_length=150,
                        help_text="Who paused it (an admin user, an API token's owner, cron_celery)"),
                ),
                migrations.AddField(
                    model_name="cronjob", name="paused_at",
                    field=models.DateTimeField(blank=True, null=True, help_text="When the pause in effect began (UTC)"),
                ),
                migrations.AddField(
                    model_name="cronjob", name="paused_until",
                    field=models.DateTimeField(
                        blank=True, null=True,
                        help_text="When the job resumes itself, by the database's clock (UTC); empty = until a "
                                  "person resumes it"),
                ),
                migrations.AddField(
                    model_name="cronjob", name="pause_after_failures",
                    field=models.IntegerField(
                        blank=True, null=True,
                        help_text="After this many final failures in a row the job pauses itself (and alerts "
                                  "PAUSED); empty = never. Declared in code"),
                ),
                # A new alert event (PAUSED): its choices are Django's only, nothing in the database.
                migrations.AlterField(
                    model_name="alert", name="event",
                    field=models.CharField(choices=[
                        ("FAILED", "Failed"), ("TIMED_OUT", "Timed out"), ("LOST", "Lost"), ("MISSED", "Missed"),
                        ("RECOVERED", "Recovered"), ("SUCCEEDED", "Succeeded"), ("UPSTREAM", "Upstream failed"),
                        ("LATE", "Late start"), ("LONG_RUNNING", "Running too long"),
                        ("TOO_FAST", "Finished too fast"), ("TOO_FAST_RECOVERED", "Long enough again"),
                        ("PAUSED", "Paused after failures")], max_length=20),
                ),
            ],
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS cron_job_pause_ends ON {JOB} (paused_until) "
                    "WHERE paused_until IS NOT NULL",
                    "DROP INDEX CONCURRENTLY IF EXISTS cron_job_pause_ends"),
            ],
            state_operations=[
                migrations.AddIndex(
                    model_name="cronjob",
                    index=models.Index(condition=models.Q(paused_until__isnull=False), fields=["paused_until"],
                                       name="cron_job_pause_ends"),
                ),
            ],
        ),
        migrations.RunSQL([PAUSE], [UNPAUSE]),  # one item: one execute(), one transaction
        migrations.RunSQL([f"{AUDIT_JOB_NOW}\n{_audit_trigger(AUDIT_WHEN_NOW)}"],
                          [f"{AUDIT_JOB_BEFORE}\n{_audit_trigger(AUDIT_WHEN_BEFORE)}"]),
        migrations.RunSQL("RESET lock_timeout", "SET lock_timeout = '2s'"),
    ]
