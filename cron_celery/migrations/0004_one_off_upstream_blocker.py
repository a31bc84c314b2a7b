# Two functions of the dependencies (after=) are replaced; no table is altered, and replacing a function takes
# no lock on the jobs or the executions table (the rules of docs/migrating.md are kept all the same, since
# the functions' text names both tables):
#
# - cron_celery_after_blocker, which names the upstream that will never run a downstream's slot, judges a slot
#   by the run its chain started from: an upstream with no run of a one-off run's instant whose schedule has
#   gone past it never runs it (before, the downstream waited for ever); and below a downstream that ran, the
#   beat's and the one-off's slots are judged as at the top (before, a second fan-in waited for ever).
# - cron_celery_after takes the one downstream job to decide for (optional): a deploy that drops an upstream
#   decides the slots left waiting for it for that downstream alone, never as a cascade.

from django.db import migrations

from cron_celery.migrations._initial import after


def _function(name: str) -> str:
    """The function ``name`` as 0001_initial made it (its text there is never edited)."""
    start = after.FORWARD.index(f"CREATE OR REPLACE FUNCTION {name}(")
    return after.FORWARD[start:after.FORWARD.index("END $function$;", start) + len("END $function$;")]


def _replaced(text: str, *pairs: tuple[str, str]) -> str:
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    return text


AFTER_BEFORE = _function("cron_celery_after")
AFTER_NOW = _replaced(
    AFTER_BEFORE,
    ("cron_celery_after(ended cron_celery_cronexecution)",
     "cron_celery_after(ended cron_celery_cronexecution, only_downstream bigint DEFAULT NULL)"),
    ("again boolean := ended.status = 'SUCCEEDED' AND ended.cascade;",
     "again boolean := ended.status = 'SUCCEEDED' AND ended.cascade AND only_downstream IS NULL;"),
    ("WHERE d.upstream_id = ended.job_id ORDER BY d.downstream_id LOOP",
     "WHERE d.upstream_id = ended.job_id\n"
     "                  AND (only_downstream IS NULL OR d.downstream_id = only_downstream) ORDER BY d.downstream_id LOOP"),
)
BLOCKER_BEFORE = _function("cron_celery_after_blocker")
BLOCKER_NOW = _replaced(
    BLOCKER_BEFORE,
    ("    found text;\nBEGIN\n",
     "    found text;\n"
     "    root text;\n"
     "BEGIN\n"
     "    -- The trigger of the run the chain started from: a downstream's run (UPSTREAM) is judged as its top.\n"
     "    WITH RECURSIVE chain(trigger, above, depth) AS (\n"
     "        SELECT ended.trigger, ended.upstream_execution_id, 0\n"
     "        UNION ALL\n"
     "        SELECT e.trigger, e.upstream_execution_id, c.depth + 1 FROM chain AS c\n"
     "        JOIN cron_celery_cronexecution AS e ON e.id = c.above WHERE c.trigger = 'UPSTREAM' AND c.depth < 20\n"
     "    )\n"
     "    SELECT chain.trigger INTO root FROM chain ORDER BY chain.depth DESC LIMIT 1;\n"),
    ("        WHEN ended.trigger IN ('BEAT', 'CATCH_UP') AND j.next_run_at > ended.slot THEN",
     "        WHEN root = 'ONE_OFF' AND j.next_run_at > ended.slot THEN\n"
     "            'has no run of this instant, and its schedule has gone past it'\n"
     "        WHEN root IN ('BEAT', 'CATCH_UP') AND j.next_run_at > ended.slot THEN"),
)
FORWARD = ("DROP FUNCTION IF EXISTS cron_celery_after(cron_celery_cronexecution);\n"
           f"{AFTER_NOW}\n{BLOCKER_NOW}\n")
BACKWARD = ("DROP FUNCTION IF EXISTS cron_celery_after(cron_celery_cronexecution, bigint);\n"
            f"{AFTER_BEFORE}\n{BLOCKER_BEFORE}\n")
LOCK = "SET lock_timeout = '5s'"
UNLOCK = "RESET lock_timeout"


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('cron_celery', '0003_periodic_task_args_and_task_edits'),
    ]

    operations = [
        migrations.RunSQL(LOCK, UNLOCK),
        migrations.RunSQL([FORWARD], [BACKWARD]),  # one item: one execute(), one transaction
        migrations.RunSQL(UNLOCK, LOCK),
    ]
