# Runs with parameters.
#
# A job's params are its periodic task's kwargs in effect (checked against the job's parameters when
# the edit is applied, schedule_sync.apply_edits); an execution's params are the values it runs with,
# written when the row is inserted (the beat copies the job's; a person's values go over them) and
# read by the worker from the row it claims. params_given marks a run with parameters a person gave:
# its own execution, which the slot checks of the other runs ignore.
#
# The periodic task's edit trigger (0003, 0018) now fires on kwargs too, so an edit of them (admin,
# ORM, raw SQL) bumps the job's schedule_version and the beat re-reads them. The after= decision
# (0017, 0018) ignores runs with parameters a person gave: they neither decide a downstream slot nor
# count as its upstream's success, and a downstream's run with parameters does not hold its slot; a
# downstream execution it inserts takes the downstream job's params.

import importlib

from django.db import migrations, models

_WINDOWS = importlib.import_module("cron_celery.migrations.0018_windows_and_one_offs")

#: What else makes an edit of a linked periodic task (the trigger's WHEN, after 0018's window columns).
KWARGS_EDITED = _WINDOWS._WINDOW_EDITED + "\n          OR OLD.kwargs IS DISTINCT FROM NEW.kwargs"
_SKIPS_KNOWN = "ended.skip_reason IN ('ALREADY_RAN', 'ALREADY_RUNNING', 'CANCELLED')"
_AFTER_0018: str = _WINDOWS._after(_SKIPS_KNOWN)

#: 0018's decision, each change an exact replacement (checked, so a drift fails loudly here).
_CHANGES = (
    ("""        RETURN 0;  -- a duplicate's skip says nothing about the slot: the execution it met decides
    END IF;
""", """        RETURN 0;  -- a duplicate's skip says nothing about the slot: the execution it met decides
    END IF;
    IF ended.params_given THEN
        RETURN 0;  -- a run with parameters a person gave is its own execution, never the slot's run
    END IF;
"""),
    ("""WHERE job_id = edge.id AND slot = ended.slot
                                  AND status = 'PENDING' AND started IS NULL);""",
     """WHERE job_id = edge.id AND slot = ended.slot
                                  AND status = 'PENDING' AND started IS NULL AND NOT params_given);"""),
    ("""WHERE job_id = edge.id AND slot = ended.slot);""",
     """WHERE job_id = edge.id AND slot = ended.slot
                                  AND NOT params_given);"""),
    ("""AND e.status = 'SUCCEEDED'));""", """AND e.status = 'SUCCEEDED' AND NOT e.params_given));"""),
    ("""attempts, upstream_execution_id, cascade)""", """attempts, upstream_execution_id, cascade, params)"""),
    ("""               ended.id, again
        FROM""", """               ended.id, again, j.params
        FROM"""),
)


def _after_with_params() -> str:
    text = _AFTER_0018
    for old, new in _CHANGES:
        assert text.count(old) == 1, f"0018's cron_celery_after changed: {old!r}"
        text = text.replace(old, new)
    return text


FORWARD = f"""
{_WINDOWS._task_trigger(KWARGS_EDITED)}
{_after_with_params()}
"""

BACKWARD = f"""
{_WINDOWS._task_trigger(_WINDOWS._WINDOW_EDITED)}
{_AFTER_0018}
"""


class Migration(migrations.Migration):

    dependencies = [
        ("cron_celery", "0019_timing_alerts"),
    ]

    operations = [
        migrations.AddField(
            model_name='cronexecution',
            name='params',
            field=models.JSONField(blank=True, help_text='The parameter values it runs with (dates as ISO strings); the parameters left out take their declared defaults; empty = none given', null=True),
        ),
        migrations.AddField(
            model_name='cronexecution',
            name='params_given',
            field=models.BooleanField(db_default=False, help_text="A run with parameters a person gave (--param, the admin, the API): its own execution, neither the slot's regular run nor skipped because the slot ran"),
        ),
        migrations.AddField(
            model_name='cronjob',
            name='params',
            field=models.JSONField(blank=True, help_text="The parameter values of its scheduled runs: the periodic task's kwargs, checked (a refused edit leaves the previous ones); empty = none", null=True),
        ),
        # The fields first: the function below reads params_given and params of the rows.
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
