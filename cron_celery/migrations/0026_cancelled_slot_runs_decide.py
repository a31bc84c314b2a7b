# A cancelled run of a slot decides the downstream slots (issue 35, item 5, found while proving it).
#
# Until now a run somebody cancelled before it started (SKIPPED, CANCELLED) decided nothing below it.
# A fan-in slot whose other upstream had already succeeded then waited for a run that would never come:
# the reconciler's pass for undecided slots decided it only while the success was under an hour old,
# naming the wrong cause ("went past this slot"), and a job with a single upstream kept no row at all.
# Now the cancel of a slot's run — one the schedule made (trigger BEAT, CATCH_UP, BACKFILL or UPSTREAM),
# the job's only run of the slot — ends the slot like any unsuccessful end: each downstream slot not yet
# decided is recorded SKIPPED (UPSTREAM) naming the cancelled execution, in the cancel's transaction, and
# the chain below it in turn. A cancelled one-off, or a run a person asked for (ENQUEUE, ADMIN, MANUAL,
# DIRECT, or with parameters) still decides nothing: it is not the slot's run, which may yet come.
#
# Replaces one function (0024's cron_celery_after); no table is read or locked beyond what
# CREATE OR REPLACE FUNCTION takes on the function itself. lock_timeout still bounds it, set first and
# reset last in both directions (docs/migrating.md), and it runs again after stopping at any operation.

import importlib

from django.db import migrations

EXE = "cron_celery_cronexecution"

_REMOVED = importlib.import_module("cron_celery.migrations.0024_removed_jobs")

#: The triggers of the runs the schedule makes for a slot: cancelling one of them ends the slot's run.
SLOT_TRIGGERS = "('BEAT', 'CATCH_UP', 'BACKFILL', 'UPSTREAM')"

_EARLY = "ended.skip_reason IN ('ALREADY_RAN', 'ALREADY_RUNNING', 'CANCELLED', 'REMOVED')"
_EARLY_NOW = f"""(ended.skip_reason IN ('ALREADY_RAN', 'ALREADY_RUNNING', 'REMOVED')
        OR (ended.skip_reason = 'CANCELLED' AND (ended.trigger NOT IN {SLOT_TRIGGERS} OR EXISTS (
            SELECT 1 FROM {EXE} AS r WHERE r.job_id = ended.job_id AND r.slot = ended.slot AND r.id <> ended.id
              AND NOT r.params_given AND r.skip_reason NOT IN ('CANCELLED', 'REMOVED')))))"""


def _after(cancel_decides: bool) -> str:
    text: str = _REMOVED._after()
    if cancel_decides:
        assert text.count(_EARLY) == 1, "0024's cron_celery_after changed"
        text = text.replace(_EARLY, _EARLY_NOW)
    return text


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("cron_celery", "0025_too_fast_incidents")]

    operations = [
        migrations.RunSQL("SET lock_timeout = '5s'", "RESET lock_timeout"),
        # A list of one item: sent whole, not split at its semicolons.
        migrations.RunSQL([_after(cancel_decides=True)], [_after(cancel_decides=False)]),
        migrations.RunSQL("RESET lock_timeout", "SET lock_timeout = '5s'"),
    ]
