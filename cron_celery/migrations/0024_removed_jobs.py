# Jobs removed from the code, and downstream slots whose upstream never runs them (issue 35, items 5-6).
#
# - removed_at on the job row: set by the schedule sync of the deploy that no longer declares the job
#   (cron_celery.removals), cleared when a deploy declares it again; a change of it is a schedule
#   change of the audit log ("declared": [true, false]), written by 0021's job trigger, which learns it.
# - SkipReason REMOVED: the executions a removed job left waiting (PENDING, RETRYING, one-off runs),
#   closed SKIPPED by that deploy. Like CANCELLED it decides nothing below it.
# - The after= decision (0017, 0018, 0020) learns two things. A downstream job removed from the code
#   gets no slot. And when an upstream succeeds while another upstream of the slot has not, the slot is
#   no longer left waiting for an upstream that will never run it: removed from the code, paused,
#   outside its active window, without a next slot, or (for a slot the beat sent) already past it —
#   the downstream slot is recorded SKIPPED (UPSTREAM) naming that upstream, in the same write, and the
#   chain below it is skipped in turn. Through chains: an upstream that is itself a downstream job with
#   no execution of the slot is judged by the jobs above it.
#
# A nullable column without a default is not written into the existing rows (no rewrite): the only wait
# is for the brief ACCESS EXCLUSIVE lock on cron_celery_cronjob (the column, then the audit trigger
# made again), bounded by lock_timeout, set first and reset last in both directions (docs/migrating.md).
# When it runs out the migration fails, and it can be run again: the column is added IF NOT EXISTS and
# dropped IF EXISTS, and the functions and the trigger change in one statement list each way (one
# execute(), which PostgreSQL runs as one transaction: the trigger never reads a column that is not there).

import importlib

from django.db import migrations, models

JOB = "cron_celery_cronjob"
EXE = "cron_celery_cronexecution"
DEP = "cron_celery_crondependency"

_PARAMS = importlib.import_module("cron_celery.migrations.0020_run_parameters")
_AUDIT = importlib.import_module("cron_celery.migrations.0021_schedule_audit")

#: An execution of the slot that counts as the job's run of it, as SQL over a row named ``r`` (not a run
#: with parameters a person gave, a cancelled one-off or what a removed job left: none is the slot's run).
_RUN_OF_SLOT = "NOT r.params_given AND r.skip_reason NOT IN ('CANCELLED', 'REMOVED')"

BLOCKER = f"""
CREATE OR REPLACE FUNCTION cron_celery_after_blocker(down bigint, ended {EXE}) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    found text;
BEGIN
    -- One statement (one snapshot: the beat writes a slot's row and moves next_run_at past it together).
    WITH RECURSIVE up(id, depth) AS (
        SELECT d.upstream_id, 1 FROM {DEP} AS d WHERE d.downstream_id = down AND d.upstream_id <> ended.job_id
        UNION
        SELECT d.upstream_id, u.depth + 1 FROM up AS u JOIN {DEP} AS d ON d.downstream_id = u.id
        WHERE u.depth < 20
          AND NOT EXISTS (SELECT 1 FROM {EXE} AS r WHERE r.job_id = u.id AND r.slot = ended.slot AND {_RUN_OF_SLOT})
    )
    SELECT format('upstream job %s (%s) %s', j.name, j.code, w.why) INTO found
    FROM up JOIN {JOB} AS j ON j.id = up.id
    CROSS JOIN LATERAL (SELECT CASE
        WHEN j.removed_at IS NOT NULL THEN 'was removed from the code'
        WHEN EXISTS (SELECT 1 FROM {DEP} AS a WHERE a.downstream_id = j.id) THEN NULL  -- the jobs above it say
        WHEN j.paused THEN 'is paused'
        WHEN j.schedule = '' THEN NULL  -- no schedule: it runs when somebody asks, which nobody can foresee
        WHEN j.active_from IS NOT NULL AND ended.slot < j.active_from THEN
            'is outside its active window (it opens at ' || cron_celery_audit_time(j.active_from) || ')'
        WHEN j.active_until IS NOT NULL AND ended.slot >= j.active_until THEN
            'is outside its active window (it closed at ' || cron_celery_audit_time(j.active_until) || ')'
        WHEN j.next_run_at IS NULL THEN 'has no next slot (its schedule is not in effect)'
        WHEN ended.trigger IN ('BEAT', 'CATCH_UP') AND j.next_run_at > ended.slot THEN
            'went past this slot without running it (it was paused, or its schedule or window edited, meanwhile)'
        END AS why) AS w
    WHERE w.why IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {EXE} AS r WHERE r.job_id = j.id AND r.slot = ended.slot AND {_RUN_OF_SLOT})
    ORDER BY up.depth, up.id LIMIT 1;
    RETURN found;
END $$;
"""

_SKIPS_KNOWN = "ended.skip_reason IN ('ALREADY_RAN', 'ALREADY_RUNNING', 'CANCELLED')"
#: 0020's decision, each change an exact replacement (checked, so a drift fails loudly here).
_CHANGES = (
    ("    decided integer := 0;\n", "    decided integer := 0;\n    blocker text;\n"),
    (_SKIPS_KNOWN, "ended.skip_reason IN ('ALREADY_RAN', 'ALREADY_RUNNING', 'CANCELLED', 'REMOVED')"),
    (f"""        PERFORM 1 FROM {JOB} WHERE id = edge.id FOR UPDATE;
""", f"""        PERFORM 1 FROM {JOB} WHERE id = edge.id FOR UPDATE;
        CONTINUE WHEN EXISTS (SELECT 1 FROM {JOB} WHERE id = edge.id AND removed_at IS NOT NULL);  -- gone: no slot
"""),
    (f"""        CONTINUE WHEN ok AND EXISTS (
            SELECT 1 FROM {DEP} AS u WHERE u.downstream_id = edge.id AND u.upstream_id <> ended.job_id
              AND NOT EXISTS (SELECT 1 FROM {EXE} AS e WHERE e.job_id = u.upstream_id AND e.slot = ended.slot
                                                        AND e.status = 'SUCCEEDED' AND NOT e.params_given));
""", f"""        blocker := NULL;
        IF ok AND EXISTS (
            SELECT 1 FROM {DEP} AS u WHERE u.downstream_id = edge.id AND u.upstream_id <> ended.job_id
              AND NOT EXISTS (SELECT 1 FROM {EXE} AS e WHERE e.job_id = u.upstream_id AND e.slot = ended.slot
                                                        AND e.status = 'SUCCEEDED' AND NOT e.params_given)) THEN
            -- Another upstream has not succeeded in the slot: wait for it, unless it never runs the slot.
            blocker := cron_celery_after_blocker(edge.id, ended);
            CONTINUE WHEN blocker IS NULL;
            ok := false;
        END IF;
"""),
    ("               CASE WHEN ok THEN '' ELSE format("
     "'Skipped: upstream job %s (%s) ended %s%s in this slot (execution %s).',",
     """               CASE WHEN ok THEN '' WHEN blocker IS NOT NULL THEN format(
                    'Skipped: %s, so it does not run this slot (execution %s of %s (%s) ended SUCCEEDED in it).',
                    blocker, ended.id, ended.task_name, ended.task_code)
                    ELSE format('Skipped: upstream job %s (%s) ended %s%s in this slot (execution %s).',"""),
    ("""        decided := decided + 1;
""", """        decided := decided + 1;
        ok := ended.status = 'SUCCEEDED';
"""),
)


def _after() -> str:
    text: str = _PARAMS._after_with_params()
    for old, new in _CHANGES:
        assert text.count(old) == 1, f"0020's cron_celery_after changed: {old!r}"
        text = text.replace(old, new)
    return text


_AUDIT_JOB: str = _AUDIT.FORWARD[_AUDIT.FORWARD.index("CREATE FUNCTION cron_celery_audit_job()"):]
_AUDIT_JOB = _AUDIT_JOB[:_AUDIT_JOB.index("EXECUTE FUNCTION cron_celery_audit_job();") +
                        len("EXECUTE FUNCTION cron_celery_audit_job();")]
_AUDIT_TRIGGER_AT = f"CREATE TRIGGER cron_celery_audit_job AFTER UPDATE ON {JOB} FOR EACH ROW"
_AUDIT_DECLARED = (
    ("    IF OLD.max_concurrency IS DISTINCT FROM NEW.max_concurrency THEN",
     """    IF (OLD.removed_at IS NULL) IS DISTINCT FROM (NEW.removed_at IS NULL) THEN
        changes := changes || jsonb_build_object('declared', jsonb_build_array(OLD.removed_at IS NULL,
                                                                               NEW.removed_at IS NULL));
    END IF;
    IF OLD.max_concurrency IS DISTINCT FROM NEW.max_concurrency THEN"""),
    ("          OR OLD.periodic_task_id IS DISTINCT FROM NEW.periodic_task_id)",
     "          OR OLD.periodic_task_id IS DISTINCT FROM NEW.periodic_task_id\n"
     "          OR (OLD.removed_at IS NULL) IS DISTINCT FROM (NEW.removed_at IS NULL))"),
)


def _audit_job(declared: bool) -> str:
    text = _AUDIT_JOB.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    if declared:
        for old, new in _AUDIT_DECLARED:
            assert text.count(old) == 1, f"0021's cron_celery_audit_job changed: {old!r}"
            text = text.replace(old, new)
    assert text.count(_AUDIT_TRIGGER_AT) == 1
    return text.replace(_AUDIT_TRIGGER_AT, f"DROP TRIGGER cron_celery_audit_job ON {JOB};\n{_AUDIT_TRIGGER_AT}")


FORWARD = f"""
{BLOCKER}
{_after()}
{_audit_job(declared=True)}
"""

BACKWARD = f"""
{_PARAMS._after_with_params()}
DROP FUNCTION IF EXISTS cron_celery_after_blocker(bigint, {EXE});
{_audit_job(declared=False)}
"""


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("cron_celery", "0023_failed_alerts_index")]

    operations = [
        migrations.RunSQL("SET lock_timeout = '5s'", "RESET lock_timeout"),
        migrations.RunSQL(
            f"ALTER TABLE {JOB} ADD COLUMN IF NOT EXISTS removed_at timestamp with time zone NULL",
            f"ALTER TABLE {JOB} DROP COLUMN IF EXISTS removed_at",
            state_operations=[migrations.AddField(
                model_name="cronjob",
                name="removed_at",
                field=models.DateTimeField(
                    blank=True, null=True,
                    help_text="When a deploy found it no longer declared in the code (its edges and waiting runs "
                              "were retired then); empty = declared"),
            )],
        ),
        migrations.AlterField(
            model_name="cronexecution",
            name="skip_reason",
            field=models.CharField(blank=True, choices=[
                ("ALREADY_RAN", "Slot already ran"), ("ALREADY_RUNNING", "Slot is running"),
                ("OVERLAP", "Job already running"), ("PAUSED", "Job paused"), ("LOCK_UNAVAILABLE", "Lock unavailable"),
                ("CONCURRENCY", "Concurrency limit"), ("UPSTREAM", "Upstream did not succeed"),
                ("CANCELLED", "Cancelled"), ("REMOVED", "Job removed from the code")], max_length=20),
        ),
        # The column first: the functions below read it. A list of one item: sent whole, not split.
        migrations.RunSQL([FORWARD], [BACKWARD]),
        migrations.RunSQL("RESET lock_timeout", "SET lock_timeout = '5s'"),
    ]
