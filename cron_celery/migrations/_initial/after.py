"""Dependencies (``after=``), decided by the database in the transaction of every final write of an
upstream's execution (part of ``0001_initial``; never edit it, a change is a new migration).

``cron_celery_after`` runs under the downstream job's row lock: the last upstream of a slot to succeed
inserts the downstream's execution PENDING (trigger UPSTREAM); an upstream that failed, was skipped or
missed the slot, or whose slot run was cancelled, inserts it SKIPPED (UPSTREAM) naming that execution;
a duplicate's skip, a run with parameters a person gave and a cancelled one-off decide nothing.
``cron_celery_after_blocker`` names the upstream that will never run a slot (paused, removed, outside
its window, without a next slot, or gone past it), so the downstream slot is skipped instead of left
waiting. The Python side is ``cron_celery.dependencies``.
"""

FORWARD = """
CREATE OR REPLACE FUNCTION cron_celery_after(ended cron_celery_cronexecution)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    edge record;
    ok boolean := ended.status = 'SUCCEEDED';
    again boolean := ended.status = 'SUCCEEDED' AND ended.cascade;
    decided integer := 0;
    blocker text;
BEGIN
    IF NOT ended.completed OR (ended.status = 'SKIPPED' AND (ended.skip_reason IN ('ALREADY_RAN', 'ALREADY_RUNNING', 'REMOVED')
        OR (ended.skip_reason = 'CANCELLED' AND (ended.trigger NOT IN ('BEAT', 'CATCH_UP', 'BACKFILL', 'UPSTREAM') OR EXISTS (
            SELECT 1 FROM cron_celery_cronexecution AS r WHERE r.job_id = ended.job_id AND r.slot = ended.slot AND r.id <> ended.id
              AND NOT r.params_given AND r.skip_reason NOT IN ('CANCELLED', 'REMOVED')))))) THEN
        RETURN 0;  -- a duplicate's skip says nothing about the slot: the execution it met decides
    END IF;
    IF ended.params_given THEN
        RETURN 0;  -- a run with parameters a person gave is its own execution, never the slot's run
    END IF;
    FOR edge IN SELECT d.downstream_id AS id FROM cron_celery_crondependency AS d WHERE d.upstream_id = ended.job_id ORDER BY d.downstream_id LOOP
        -- The downstream's row lock, in a statement of its own: the checks below then see every
        -- upstream outcome committed before it (two upstreams ending at once: the second decides).
        PERFORM 1 FROM cron_celery_cronjob WHERE id = edge.id FOR UPDATE;
        CONTINUE WHEN EXISTS (SELECT 1 FROM cron_celery_cronjob WHERE id = edge.id AND removed_at IS NOT NULL);  -- gone: no slot
        IF again THEN
            CONTINUE WHEN EXISTS (SELECT 1 FROM cron_celery_cronexecution WHERE job_id = edge.id AND slot = ended.slot
                                  AND status = 'PENDING' AND started IS NULL AND NOT params_given);
        ELSE
            CONTINUE WHEN EXISTS (SELECT 1 FROM cron_celery_cronexecution WHERE job_id = edge.id AND slot = ended.slot
                                  AND NOT params_given);
        END IF;
        blocker := NULL;
        IF ok AND EXISTS (
            SELECT 1 FROM cron_celery_crondependency AS u WHERE u.downstream_id = edge.id AND u.upstream_id <> ended.job_id
              AND NOT EXISTS (SELECT 1 FROM cron_celery_cronexecution AS e WHERE e.job_id = u.upstream_id AND e.slot = ended.slot
                                                        AND e.status = 'SUCCEEDED' AND NOT e.params_given)) THEN
            -- Another upstream has not succeeded in the slot: wait for it, unless it never runs the slot.
            blocker := cron_celery_after_blocker(edge.id, ended);
            CONTINUE WHEN blocker IS NULL;
            ok := false;
        END IF;
        INSERT INTO cron_celery_cronexecution (job_id, task_code, task_name, slot, execution_date, run_number, status, trigger,
                           skip_reason, forced, created_at, started, ended, completed, success, message,
                           error_code, traceback, retry_count, celery_task_id, worker, pid, fence, lease_until,
                           attempts, upstream_execution_id, cascade, params)
        SELECT j.id, j.code, j.name, ended.slot, (ended.slot AT TIME ZONE j.timezone)::date,
               coalesce((SELECT max(run_number) FROM cron_celery_cronexecution WHERE job_id = j.id AND slot = ended.slot), 0) + 1,
               CASE WHEN ok THEN 'PENDING' ELSE 'SKIPPED' END, 'UPSTREAM', CASE WHEN ok THEN '' ELSE 'UPSTREAM' END,
               again, now(), NULL, CASE WHEN ok THEN NULL ELSE now() END, NOT ok, NULL,
               CASE WHEN ok THEN '' WHEN blocker IS NOT NULL THEN format(
                    'Skipped: %s, so it does not run this slot (execution %s of %s (%s) ended SUCCEEDED in it).',
                    blocker, ended.id, ended.task_name, ended.task_code)
                    ELSE format('Skipped: upstream job %s (%s) ended %s%s in this slot (execution %s).',
                    ended.task_name, ended.task_code, ended.status,
                    CASE WHEN ended.skip_reason <> '' THEN ', ' || ended.skip_reason ELSE '' END, ended.id) END,
               '', '', 0, CASE WHEN ok THEN gen_random_uuid()::text ELSE '' END, '', NULL, NULL, NULL, '[]'::jsonb,
               ended.id, again, j.params
        FROM cron_celery_cronjob AS j WHERE j.id = edge.id;
        decided := decided + 1;
        ok := ended.status = 'SUCCEEDED';
    END LOOP;
    RETURN decided;
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_upstream_ended()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF TG_OP = 'INSERT' OR NOT OLD.completed THEN
        PERFORM cron_celery_after(NEW);
    END IF;
    RETURN NULL;
END $function$;

CREATE OR REPLACE FUNCTION cron_celery_after_blocker(down bigint, ended cron_celery_cronexecution)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    found text;
BEGIN
    -- One statement (one snapshot: the beat writes a slot's row and moves next_run_at past it together).
    WITH RECURSIVE up(id, depth) AS (
        SELECT d.upstream_id, 1 FROM cron_celery_crondependency AS d WHERE d.downstream_id = down AND d.upstream_id <> ended.job_id
        UNION
        SELECT d.upstream_id, u.depth + 1 FROM up AS u JOIN cron_celery_crondependency AS d ON d.downstream_id = u.id
        WHERE u.depth < 20
          AND NOT EXISTS (SELECT 1 FROM cron_celery_cronexecution AS r WHERE r.job_id = u.id AND r.slot = ended.slot AND NOT r.params_given AND r.skip_reason NOT IN ('CANCELLED', 'REMOVED'))
    )
    SELECT format('upstream job %s (%s) %s', j.name, j.code, w.why) INTO found
    FROM up JOIN cron_celery_cronjob AS j ON j.id = up.id
    CROSS JOIN LATERAL (SELECT CASE
        WHEN j.removed_at IS NOT NULL THEN 'was removed from the code'
        WHEN EXISTS (SELECT 1 FROM cron_celery_crondependency AS a WHERE a.downstream_id = j.id) THEN NULL  -- the jobs above it say
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
      AND NOT EXISTS (SELECT 1 FROM cron_celery_cronexecution AS r WHERE r.job_id = j.id AND r.slot = ended.slot AND NOT r.params_given AND r.skip_reason NOT IN ('CANCELLED', 'REMOVED'))
    ORDER BY up.depth, up.id LIMIT 1;
    RETURN found;
END $function$;

CREATE TRIGGER cron_celery_upstream_ended AFTER INSERT OR UPDATE OF status, completed ON cron_celery_cronexecution
    FOR EACH ROW WHEN (new.completed) EXECUTE FUNCTION cron_celery_upstream_ended();
"""

BACKWARD = """
DROP FUNCTION IF EXISTS cron_celery_after_blocker(bigint,cron_celery_cronexecution) CASCADE;
DROP FUNCTION IF EXISTS cron_celery_upstream_ended() CASCADE;
DROP FUNCTION IF EXISTS cron_celery_after(cron_celery_cronexecution) CASCADE;
"""
