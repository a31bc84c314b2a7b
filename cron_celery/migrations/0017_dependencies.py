# Dependencies (after=): the edges between jobs, and the trigger that decides a downstream job's
# slot in the same transaction as the final write of an upstream job's execution of it: when the
# last upstream succeeded, the downstream's execution is inserted PENDING (trigger UPSTREAM, to be
# sent after the commit by whoever wrote the outcome, or by the reconciler); when an upstream
# failed, was skipped or missed, it is inserted SKIPPED (UPSTREAM), which in turn decides the
# jobs after it. One decision per downstream slot, except after a re-run with --cascade.

import django.db.models.deletion
from django.db import migrations, models

EXE = "cron_celery_cronexecution"
JOB = "cron_celery_cronjob"
DEP = "cron_celery_crondependency"

FORWARD = f"""
CREATE FUNCTION cron_celery_after(ended {EXE}) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    edge record;
    ok boolean := ended.status = 'SUCCEEDED';
    again boolean := ended.status = 'SUCCEEDED' AND ended.cascade;
    decided integer := 0;
BEGIN
    IF NOT ended.completed OR (ended.status = 'SKIPPED' AND ended.skip_reason IN ('ALREADY_RAN', 'ALREADY_RUNNING')) THEN
        RETURN 0;  -- a duplicate's skip says nothing about the slot: the execution it met decides
    END IF;
    FOR edge IN SELECT d.downstream_id AS id FROM {DEP} AS d WHERE d.upstream_id = ended.job_id ORDER BY d.downstream_id LOOP
        -- The downstream's row lock, in a statement of its own: the checks below then see every
        -- upstream outcome committed before it (two upstreams ending at once: the second decides).
        PERFORM 1 FROM {JOB} WHERE id = edge.id FOR UPDATE;
        IF again THEN
            CONTINUE WHEN EXISTS (SELECT 1 FROM {EXE} WHERE job_id = edge.id AND slot = ended.slot
                                  AND status = 'PENDING' AND started IS NULL);
        ELSE
            CONTINUE WHEN EXISTS (SELECT 1 FROM {EXE} WHERE job_id = edge.id AND slot = ended.slot);
        END IF;
        CONTINUE WHEN ok AND EXISTS (
            SELECT 1 FROM {DEP} AS u WHERE u.downstream_id = edge.id AND u.upstream_id <> ended.job_id
              AND NOT EXISTS (SELECT 1 FROM {EXE} AS e WHERE e.job_id = u.upstream_id AND e.slot = ended.slot
                                                        AND e.status = 'SUCCEEDED'));
        INSERT INTO {EXE} (job_id, task_code, task_name, slot, execution_date, run_number, status, trigger,
                           skip_reason, forced, created_at, started, ended, completed, success, message,
                           error_code, traceback, retry_count, celery_task_id, worker, pid, fence, lease_until,
                           attempts, upstream_execution_id, cascade)
        SELECT j.id, j.code, j.name, ended.slot, (ended.slot AT TIME ZONE j.timezone)::date,
               coalesce((SELECT max(run_number) FROM {EXE} WHERE job_id = j.id AND slot = ended.slot), 0) + 1,
               CASE WHEN ok THEN 'PENDING' ELSE 'SKIPPED' END, 'UPSTREAM', CASE WHEN ok THEN '' ELSE 'UPSTREAM' END,
               again, now(), NULL, CASE WHEN ok THEN NULL ELSE now() END, NOT ok, NULL,
               CASE WHEN ok THEN '' ELSE format('Skipped: upstream job %s (%s) ended %s%s in this slot (execution %s).',
                    ended.task_name, ended.task_code, ended.status,
                    CASE WHEN ended.skip_reason <> '' THEN ', ' || ended.skip_reason ELSE '' END, ended.id) END,
               '', '', 0, CASE WHEN ok THEN gen_random_uuid()::text ELSE '' END, '', NULL, NULL, NULL, '[]'::jsonb,
               ended.id, again
        FROM {JOB} AS j WHERE j.id = edge.id;
        decided := decided + 1;
    END LOOP;
    RETURN decided;
END $$;

CREATE FUNCTION cron_celery_upstream_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NOT OLD.completed THEN
        PERFORM cron_celery_after(NEW);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER cron_celery_upstream_ended AFTER INSERT OR UPDATE OF status, completed ON {EXE}
    FOR EACH ROW WHEN (NEW.completed) EXECUTE FUNCTION cron_celery_upstream_ended();
"""

BACKWARD = f"""
DROP TRIGGER IF EXISTS cron_celery_upstream_ended ON {EXE};
DROP FUNCTION IF EXISTS cron_celery_upstream_ended();
DROP FUNCTION IF EXISTS cron_celery_after({EXE});
"""


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0016_jitter'),
    ]

    operations = [
        migrations.AddField(
            model_name='cronexecution',
            name='cascade',
            field=models.BooleanField(db_default=False, help_text="Re-run with --cascade: its success runs the downstream jobs' slot again"),
        ),
        migrations.AddField(
            model_name='cronexecution',
            name='upstream_execution_id',
            field=models.BigIntegerField(blank=True, help_text="The upstream job's execution of this slot that created this one", null=True),
        ),
        migrations.AlterField(
            model_name='cronexecution',
            name='skip_reason',
            field=models.CharField(blank=True, choices=[('ALREADY_RAN', 'Slot already ran'), ('ALREADY_RUNNING', 'Slot is running'), ('OVERLAP', 'Job already running'), ('PAUSED', 'Job paused'), ('LOCK_UNAVAILABLE', 'Lock unavailable'), ('CONCURRENCY', 'Concurrency limit'), ('UPSTREAM', 'Upstream did not succeed')], max_length=20),
        ),
        migrations.AlterField(
            model_name='cronexecution',
            name='trigger',
            field=models.CharField(choices=[('BEAT', 'Beat'), ('MANUAL', 'Manual'), ('ENQUEUE', 'Enqueued'), ('ADMIN', 'Admin'), ('DIRECT', 'Direct call'), ('CATCH_UP', 'Catch-up'), ('BACKFILL', 'Backfill'), ('UPSTREAM', 'Upstream')], default='BEAT', max_length=20),
        ),
        migrations.CreateModel(
            name='CronDependency',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('downstream', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='upstream_edges', to='cron_celery.cronjob')),
                ('upstream', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='downstream_edges', to='cron_celery.cronjob')),
            ],
            options={
                'verbose_name': 'cron dependency',
                'constraints': [models.UniqueConstraint(fields=('upstream', 'downstream'), name='cron_dependency_once')],
            },
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
