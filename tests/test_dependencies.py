"""Dependencies (``after=``) step by step against real PostgreSQL: the declaration's rules and
cycles, the edges, the database trigger that decides a downstream slot in the transaction of an
upstream's final write (fan-in, failures and skips down a chain, duplicates that decide nothing,
cascades), the send after the commit, the reconciler, the check and schedule edits."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection, connections, transaction
from django.test import override_settings

from cron_celery import checks, exceptions, reconciler
from cron_celery.alerts import delivery, signals
from cron_celery.beat import schedule_sync
from cron_celery.decisions import claims, dependencies, dispatch, executions, finishes, repairs
from cron_celery.decisions import jobs as job_rows
from cron_celery.declaring import registry
from cron_celery.models import Alert, CronDependency, CronExecution, CronJob, SkipReason, Status, Trigger
from cron_celery.run import decorators, events, outcomes, runs, tasks
from cron_celery.schedules import every
from tests.celery_app import app
from tests.conftest import db_now, expire_lease
from tests.test_waiting import RECONCILE, begin, row

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
HOURLY = every(hours=1)


def chain(declare, *, extra_after: tuple[str, ...] = ()) -> dict[str, tuple[registry.Job, int]]:
    """extract and transform (hourly) -> load -> report; the edges and rows written."""
    made = {
        "extract": declare("dep-extract", "DX1", schedule=HOURLY),
        "transform": declare("dep-transform", "DX2", schedule=HOURLY),
        "load": declare("dep-load", "DX3", after=["dep-extract", "dep-transform", *extra_after]),
        "report": declare("dep-report", "DX4", after="dep-load"),
    }
    dependencies.sync(list(made.values()))
    ids = {job.code: job_id for job_id, job in
           ((row_id, job) for job in made.values() for row_id in [CronJob.objects.get(code=job.code).id])}
    return {key: (job, ids[job.code]) for key, job in made.items()}


def run(job: registry.Job, job_id: int, status: str = Status.SUCCEEDED, slot: dt.datetime = SLOT,
        cascade: bool = False, **fields: str) -> int:
    """One execution of the slot, claimed and finished with ``status`` the way a worker does."""
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=slot, execution_date=slot.date(),
                                       trigger=Trigger.ENQUEUE, forced=True, cascade=cascade)
    claim = begin(job, job_id, slot, execution_id=execution_id, trigger=Trigger.ENQUEUE)
    assert claim.outcome == Status.RUNNING, claim
    assert finishes.finish(job_id=job_id, execution_id=execution_id, fence=claim.fence, status=status,
                           message=fields.get("message", ""), error_code=fields.get("error_code", ""))
    return execution_id


def of(job_id: int, slot: dt.datetime = SLOT) -> list[CronExecution]:
    return list(CronExecution.objects.filter(job_id=job_id, slot=slot).order_by("run_number"))


def test_after_is_declared_without_a_schedule_and_a_cycle_is_refused_with_the_cycle_named(declare):
    job = declare("dep-a", "DA1", after=["dep-b", "dep-c", "dep-b"])
    assert job.after == ("dep-b", "dep-c") and job.schedule is None
    with pytest.raises(exceptions.ImproperlyDeclared, match="has no schedule of its own"):
        registry.declare(name="dep-x", code="DXX", task_name="t", after=["dep-a"], schedule=HOURLY)
    for bad in ([], 5, ["Not A Slug"]):
        with pytest.raises(exceptions.ImproperlyDeclared, match="after must be a job name or a list of job names"):
            registry.declare(name="dep-x", code="DXX", task_name="t", after=bad)
    with pytest.raises(exceptions.ImproperlyDeclared, match="cannot run after itself"):
        registry.declare(name="dep-x", code="DXX", task_name="t", after=["dep-x"])
    declare("dep-b", "DB1", after=["dep-c"])
    with pytest.raises(exceptions.ImproperlyDeclared,
                       match="its after= makes a cycle: dep-c runs after dep-a runs after dep-b runs after dep-c"):
        declare("dep-c", "DC1", after=["dep-a"])
    assert "dep-c" not in {j.name for j in registry.all_jobs()}


def test_the_check_names_an_undeclared_upstream_and_upstreams_without_one_schedule(declare):
    declare("dep-hourly", "DH1", schedule=HOURLY)
    declare("dep-daily", "DH2", schedule="0 3 * * *")
    declare("dep-mixed", "DH3", after=["dep-hourly", "dep-daily"])
    declare("dep-orphan", "DH4", after=["nowhere-at-all"])
    declare("dep-fine", "DH5", after=["dep-hourly"])
    declare("dep-typo", "DH6", after=["dep-hourlly"])
    found = [(e.id, e.msg) for e in checks.check_dependencies()]
    assert ("cron_celery.E016", "Job 'dep-orphan' runs after 'nowhere-at-all', which is not declared.") in found
    assert ("cron_celery.E016", "Job 'dep-typo' runs after 'dep-hourlly', which is not declared: "
                                "did you mean 'dep-hourly'? (for 'dep-hourlly').") in found
    mixed = [msg for _id, msg in found if msg.startswith("Job 'dep-mixed'")]
    assert mixed == ["Job 'dep-mixed': its upstream jobs must share one schedule, and they do not "
                     "(dep-daily: 0 3 * * * (UTC); dep-hourly: every 3600s (UTC))."]
    assert not [msg for _id, msg in found if "dep-fine" in msg]


def test_edges_follow_the_declarations(declare):
    jobs_ = chain(declare)
    load_id = jobs_["load"][1]
    assert set(CronDependency.objects.filter(downstream_id=load_id).values_list("upstream__code", flat=True)) == {
        "DX1", "DX2"}
    registry.unregister("dep-load")
    smaller = declare("dep-load", "DX3", after=["dep-extract"])
    dependencies.sync([smaller, jobs_["extract"][0]])
    assert list(CronDependency.objects.filter(downstream_id=load_id).values_list("upstream__code", flat=True)) == [
        "DX1"]


def test_the_last_upstream_to_succeed_creates_the_downstream_slot_pending_and_its_success_sends_it(declare, queue):
    jobs_ = chain(declare)
    (extract, extract_id), (transform, transform_id) = jobs_["extract"], jobs_["transform"]
    load_id = jobs_["load"][1]
    run(extract, extract_id)
    assert of(load_id) == []  # transform has not succeeded in this slot yet
    last = run(transform, transform_id)
    (down,) = of(load_id)
    assert (down.status, down.trigger, down.upstream_execution_id, down.run_number) == (
        Status.PENDING, Trigger.UPSTREAM, last, 1)
    assert down.celery_task_id and down.execution_date == SLOT.date() and not down.forced
    assert [item.execution_id for item in dependencies.created_by([last])] == [down.id]
    # Sent after the commit, with its own task id, to the downstream's task.
    assert tasks.send_downstream(app, last) == 1
    [sent] = queue.headers()
    assert (sent["id"], sent[tasks.HEADER_EXECUTION], sent[tasks.HEADER_TRIGGER], sent["task"]) == (
        down.celery_task_id, down.id, Trigger.UPSTREAM, jobs_["load"][0].task_name)
    # Another success of the slot (a re-run without --cascade) decides nothing more.
    run(transform, transform_id)
    assert len(of(load_id)) == 1


@pytest.mark.parametrize("status", [Status.FAILED, Status.TIMED_OUT, Status.LOST, Status.REVOKED])
def test_an_upstream_failure_skips_the_downstream_slot_and_the_chain_below_it(declare, status):
    jobs_ = chain(declare)
    failed = run(*jobs_["extract"], status=status, error_code="Boom")
    (load,) = of(jobs_["load"][1])
    assert (load.status, load.skip_reason, load.trigger, load.completed, load.upstream_execution_id) == (
        Status.SKIPPED, SkipReason.UPSTREAM, Trigger.UPSTREAM, True, failed)
    assert load.message == f"Skipped: upstream job dep-extract (DX1) ended {status} in this slot (execution {failed})."
    (report,) = of(jobs_["report"][1])  # and so on down the chain
    assert (report.status, report.skip_reason, report.upstream_execution_id) == (
        Status.SKIPPED, SkipReason.UPSTREAM, load.id)
    assert "dep-load (DX3) ended SKIPPED, UPSTREAM" in report.message
    # The other upstream's later success changes nothing: the slot was decided.
    run(*jobs_["transform"])
    assert len(of(jobs_["load"][1])) == 1


def test_a_skip_or_a_missed_slot_stops_the_chain_but_a_duplicates_skip_decides_nothing(declare):
    jobs_ = chain(declare)
    (extract, extract_id), (transform, transform_id) = jobs_["extract"], jobs_["transform"]
    load_id = jobs_["load"][1]
    run(extract, extract_id)
    # A duplicate delivery of transform's slot while it runs: ALREADY_RUNNING says nothing.
    live_id, _ = dispatch.enqueue(job=transform, job_id=transform_id, slot=SLOT, execution_date=SLOT.date(),
                                  trigger=Trigger.BEAT)
    live = begin(transform, transform_id, SLOT, execution_id=live_id, trigger=Trigger.BEAT)
    duplicate = begin(transform, transform_id, SLOT, trigger=Trigger.DIRECT)
    assert duplicate.skip_reason == SkipReason.ALREADY_RUNNING
    assert of(load_id) == []
    finishes.finish(job_id=transform_id, execution_id=live_id, fence=live.fence, status=Status.SUCCEEDED)
    assert [r.status for r in of(load_id)] == [Status.PENDING]
    # A slot recorded MISSED by the beat stops the chain there.
    later = SLOT + dt.timedelta(hours=1)
    dispatch.dispatch_many([dispatch.Decision(job_id=extract_id, expected_next_run_at=None, next_run_at=later,
                                              run=[], missed=[later], tz=dt.UTC)])
    CronJob.objects.filter(id=extract_id).update(next_run_at=None)
    (load,) = of(load_id, later)
    assert (load.status, load.skip_reason) == (Status.SKIPPED, SkipReason.UPSTREAM) and "MISSED" in load.message
    # A paused upstream's skip too.
    third = SLOT + dt.timedelta(hours=2)
    CronJob.objects.filter(id=transform_id).update(paused=True)
    paused = begin(transform, transform_id, third, trigger=Trigger.DIRECT)
    assert paused.skip_reason == SkipReason.PAUSED
    (load,) = of(load_id, third)
    assert load.skip_reason == SkipReason.UPSTREAM and "SKIPPED, PAUSED" in load.message


def test_a_rerun_with_cascade_runs_the_downstream_slot_again_and_down_the_chain(declare):
    jobs_ = chain(declare)
    run(*jobs_["extract"])
    first = run(*jobs_["transform"], status=Status.FAILED)
    load_id, report_id = jobs_["load"][1], jobs_["report"][1]
    assert [r.skip_reason for r in of(load_id)] == [SkipReason.UPSTREAM]
    again = run(*jobs_["transform"], cascade=True)
    loads = of(load_id)
    assert [(r.run_number, r.status, r.forced, r.cascade) for r in loads] == [
        (1, Status.SKIPPED, False, False), (2, Status.PENDING, True, True)]
    assert loads[1].upstream_execution_id == again and first != again
    # The cascade goes on: load's success runs report's slot again too.
    load, load_id_ = jobs_["load"]
    claim = begin(load, load_id_, SLOT, execution_id=loads[1].id, trigger=Trigger.UPSTREAM)
    assert claim.outcome == Status.RUNNING
    finishes.finish(job_id=load_id_, execution_id=loads[1].id, fence=claim.fence, status=Status.SUCCEEDED)
    assert [(r.run_number, r.status) for r in of(report_id)] == [(1, Status.SKIPPED), (2, Status.PENDING)]
    # A cascade while the downstream slot still waits to start adds nothing.
    run(*jobs_["load"][:2], cascade=True)
    assert [(r.run_number, r.status) for r in of(report_id)] == [(1, Status.SKIPPED), (2, Status.PENDING)]


def _succeed_at(barrier: threading.Barrier, execution_id: int, errors: list[BaseException]) -> None:
    """In a thread of its own (its own connection): wait for the other, then write the success."""
    try:
        with connection.cursor() as cursor:
            barrier.wait(timeout=10)
            cursor.execute(f"UPDATE {executions.EXE} SET status = 'SUCCEEDED', completed = true, success = true, "
                           "ended = now() WHERE id = %s", [execution_id])
    except BaseException as error:  # reported by the test
        errors.append(error)
    finally:
        connections.close_all()


def test_two_upstreams_succeeding_at_once_create_the_downstream_slot_exactly_once(declare):
    """The trigger takes the downstream's row lock in a statement of its own, so the second of two
    concurrent final writes sees the first; without it neither would create the slot."""
    jobs_ = chain(declare)
    upstream_ids = [jobs_["extract"][1], jobs_["transform"][1]]
    running = []
    for job, job_id in (jobs_["extract"], jobs_["transform"]):
        execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                           trigger=Trigger.ENQUEUE)
        begin(job, job_id, SLOT, execution_id=execution_id, trigger=Trigger.ENQUEUE)
        running.append(execution_id)
    for _attempt in range(8):
        CronExecution.objects.filter(job_id=jobs_["load"][1]).delete()
        CronExecution.objects.filter(job_id__in=upstream_ids).update(status=Status.RUNNING, completed=False,
                                                                     success=None)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_succeed_at, args=(barrier, execution_id, errors))
                   for execution_id in running]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors, errors
        assert [r.status for r in of(jobs_["load"][1])] == [Status.PENDING]


@override_settings(CRON_CELERY={"RECONCILE": RECONCILE})
def test_the_reconciler_decides_a_slot_whose_upstreams_ended_before_the_edge_existed(declare):
    made = {
        "extract": declare("dep-extract", "DX1", schedule=HOURLY),
        "transform": declare("dep-transform", "DX2", schedule=HOURLY),
    }
    from cron_celery.decisions import jobs as job_rows
    ids = job_rows.refresh_job_ids(list(made.values()))
    load = declare("dep-load", "DX3", after=["dep-extract", "dep-transform"])
    load_id = job_rows.ensure_job(load)
    CronJob.objects.filter(id=load_id).update(created_at=SLOT - dt.timedelta(days=1))
    first = run(made["extract"], ids["DX1"])
    last = run(made["transform"], ids["DX2"])
    dependencies.sync([*made.values(), load])  # the deploy that declared the dependency
    assert of(load_id) == []
    assert reconciler.run_pass().downstream == 0  # ended within PENDING_GRACE: its writer may yet decide
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {executions.EXE} SET ended = now() - interval '2 minutes' WHERE job_id = ANY(%s)",
                       [[ids["DX1"], ids["DX2"]]])
    report = reconciler.run_pass()
    assert report.downstream == 1
    (down,) = of(load_id)
    assert (down.status, down.trigger) == (Status.PENDING, Trigger.UPSTREAM)
    assert down.upstream_execution_id in (first, last)  # both succeeded: either decides it
    assert reconciler.run_pass().downstream == 0  # decided once


def test_a_slot_waiting_for_an_upstream_that_a_deploy_removes_is_decided_by_the_others_at_that_deploy(
        declare, queue):
    """Found by the features model (tests/model/test_features_model.py): extract succeeded in a slot
    while transform still ran it, so load waited for transform. A deploy then removed transform from
    the code (load now runs after extract alone), and transform's run ended: a removed job's end decides
    nothing, and extract's success was long over, so load's slot was never decided. Now the deploy that
    drops the edge decides the slots that waited for it, and sends what runs."""
    jobs_ = chain(declare)
    (extract, extract_id), (transform, transform_id) = jobs_["extract"], jobs_["transform"]
    load_id = jobs_["load"][1]
    slot = db_now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=5)
    CronJob.objects.filter(id=load_id).update(created_at=slot - dt.timedelta(days=1))
    first = run(extract, extract_id, slot=slot)
    running = begin(transform, transform_id, slot)
    assert running.outcome == Status.RUNNING and of(load_id, slot) == []  # load waits for transform
    with connection.cursor() as cursor:  # long ago: past the reconciler's look back at upstreams that ended
        cursor.execute(f"UPDATE {executions.EXE} SET ended = now() - interval '3 hours' WHERE id = %s", [first])
    registry.unregister(transform.name)
    declare("dep-load", "DX3", after=["dep-extract"])  # the deploy's code: load after extract alone
    schedule_sync.sync()
    (down,) = of(load_id, slot)
    assert (down.status, down.trigger, down.upstream_execution_id) == (Status.PENDING, Trigger.UPSTREAM, first)
    assert [headers["cron_execution_id"] for headers in queue.headers()] == [down.id]  # sent by the deploy
    assert finishes.finish(job_id=transform_id, execution_id=running.execution_id, fence=running.fence,
                           status=Status.SUCCEEDED, message="", error_code="")
    assert [r.id for r in of(load_id, slot)] == [down.id]  # the removed job's end decides nothing more
    schedule_sync.sync()  # the next deploy: nothing waits any more
    assert [r.id for r in of(load_id, slot)] == [down.id] and len(queue.headers()) == 1


def _one_off_run(job: registry.Job, job_id: int, at: dt.datetime) -> int:
    """A one-off run of ``job`` at ``at``, recorded, taken by a beat, claimed and succeeded."""
    from cron_celery.decisions import oneoffs

    recorded = oneoffs.record(job, job_id, at)
    claim = begin(job, job_id, at, execution_id=recorded.execution_id, trigger=Trigger.ONE_OFF)
    assert claim.outcome == Status.RUNNING, claim
    assert finishes.finish(job_id=job_id, execution_id=recorded.execution_id, fence=claim.fence,
                           status=Status.SUCCEEDED, message="", error_code="")
    return recorded.execution_id


def test_a_one_off_run_of_one_upstream_at_an_instant_the_others_have_gone_past_skips_the_slot_below(declare):
    """Found by the features model: a one-off run of extract at 18:30 succeeded; transform runs on the
    hour, its next slot was already past 18:30 and it had no run of it, so load's 18:30 waited for a
    run that would never come. Now transform is named as the upstream that does not run the slot. One-off
    runs of both at one instant still run load after both."""
    jobs_ = chain(declare)
    (extract, extract_id), (transform, transform_id) = jobs_["extract"], jobs_["transform"]
    load_id = jobs_["load"][1]
    schedule_sync.sync()  # their schedules on their rows
    at = db_now().replace(minute=30, second=0, microsecond=0) + dt.timedelta(days=2)
    CronJob.objects.filter(id__in=[extract_id, transform_id]).update(next_run_at=at + dt.timedelta(minutes=30))
    first = _one_off_run(extract, extract_id, at)
    (down,) = of(load_id, at)
    assert (down.status, down.skip_reason, down.upstream_execution_id) == (Status.SKIPPED, SkipReason.UPSTREAM, first)
    assert "upstream job dep-transform (DX2)" in down.message, down.message
    (below,) = of(jobs_["report"][1], at)
    assert (below.status, below.skip_reason) == (Status.SKIPPED, SkipReason.UPSTREAM)

    both = at + dt.timedelta(days=1)
    from cron_celery.decisions import oneoffs

    CronJob.objects.filter(id__in=[extract_id, transform_id]).update(next_run_at=both + dt.timedelta(minutes=30))
    waiting = oneoffs.record(transform, transform_id, both)  # recorded first: load waits for it
    _one_off_run(extract, extract_id, both)
    assert of(load_id, both) == []
    claim = begin(transform, transform_id, both, execution_id=waiting.execution_id, trigger=Trigger.ONE_OFF)
    assert finishes.finish(job_id=transform_id, execution_id=waiting.execution_id, fence=claim.fence,
                           status=Status.SUCCEEDED, message="", error_code="")
    (after_both,) = of(load_id, both)
    assert (after_both.status, after_both.trigger) == (Status.PENDING, Trigger.UPSTREAM)


def test_a_second_fan_in_below_a_downstream_that_ran_judges_the_slot_as_its_top_did(declare):
    """Found in review of the features model's fix: report runs after load and audit (hourly); load ran a
    slot its upstreams' beat slots made; audit's schedule had gone past that slot without running it.
    Below the top of the chain the slot was judged by load's own trigger (UPSTREAM) and report waited for
    ever; it is now judged as the beat's slot it started from: skipped, naming audit."""
    made = {key: declare(f"dep-{key}", f"DY{n}", schedule=HOURLY) for n, key in enumerate(["extract", "audit"])}
    made["load"] = declare("dep-load", "DY7", after=["dep-extract"])
    made["report"] = declare("dep-report", "DY8", after=["dep-load", "dep-audit"])
    dependencies.sync(list(made.values()))
    schedule_sync.sync()
    ids = {key: CronJob.objects.get(code=job.code).id for key, job in made.items()}
    CronJob.objects.filter(id=ids["audit"]).update(next_run_at=SLOT + dt.timedelta(hours=1))
    execution_id, _ = dispatch.enqueue(job=made["extract"], job_id=ids["extract"], slot=SLOT,
                                       execution_date=SLOT.date(), trigger=Trigger.BEAT)
    claim = begin(made["extract"], ids["extract"], SLOT, execution_id=execution_id, trigger=Trigger.BEAT)
    assert finishes.finish(job_id=ids["extract"], execution_id=execution_id, fence=claim.fence,
                           status=Status.SUCCEEDED, message="", error_code="")
    (load_row,) = of(ids["load"])
    claim = begin(made["load"], ids["load"], SLOT, execution_id=load_row.id, trigger=Trigger.UPSTREAM)
    assert finishes.finish(job_id=ids["load"], execution_id=load_row.id, fence=claim.fence,
                           status=Status.SUCCEEDED, message="", error_code="")
    (report,) = of(ids["report"])
    assert (report.status, report.skip_reason) == (Status.SKIPPED, SkipReason.UPSTREAM)
    assert "upstream job dep-audit (DY1) went past this slot" in report.message, report.message


def test_an_admin_edit_that_splits_the_upstreams_schedules_is_recorded_on_the_downstream(declare):
    jobs_ = chain(declare)
    schedule_sync.sync()
    load_id = jobs_["load"][1]
    assert CronJob.objects.get(id=load_id).schedule_problem == ""
    CronJob.objects.filter(id=jobs_["transform"][1]).update(schedule="0 4 * * *", schedule_timezone="UTC")
    assert dependencies.note_in_effect_problems([jobs_["report"][1]]) == []  # nothing below report
    written = dependencies.note_in_effect_problems([jobs_["transform"][1]])  # what the edit's tick reads
    problem = CronJob.objects.get(id=load_id).schedule_problem
    assert ("dep-load", problem) in written and ("dep-report", CronJob.objects.get(id=jobs_["report"][1])
                                                .schedule_problem) in written
    assert problem.startswith("its upstream jobs no longer share one schedule (dep-extract: every 3600s (UTC); "
                              "dep-transform: 0 4 * * * (UTC))")
    CronJob.objects.filter(id=jobs_["transform"][1]).update(schedule="every 3600s", schedule_timezone="")
    dependencies.note_in_effect_problems()
    assert CronJob.objects.get(id=load_id).schedule_problem == ""


def test_a_downstream_slot_waits_for_its_jobs_live_run_instead_of_being_skipped(declare):
    jobs_ = chain(declare)
    load, load_id = jobs_["load"]
    live = begin(load, load_id, SLOT + dt.timedelta(hours=5))  # overlap skip: one at a time
    run(*jobs_["extract"])
    run(*jobs_["transform"])
    (down,) = of(load_id)
    claim = begin(load, load_id, SLOT, execution_id=down.id, trigger=Trigger.UPSTREAM)
    assert (claim.outcome, claim.blocker) == (claims.WAITING, live.execution_id)
    assert row(down.id).status == Status.PENDING and row(down.id).waiting_since is not None


def test_run_cron_task_runs_the_upstreams_in_process_and_cascade_runs_the_downstream_again(queue):
    """The command's in-process runs: the last upstream's success sends the downstream to the
    workers; ``--rerun --cascade`` of an upstream runs it again."""
    from django.core.management import call_command

    from tests.jobsapp import jobs_chain

    chain_jobs = [jobs_chain.chain_extract.job, jobs_chain.chain_transform.job, jobs_chain.chain_load.job]
    dependencies.sync(chain_jobs)
    at = "2026-11-29T05:00Z"
    call_command("run_cron_task", "chain-extract", at=at)
    assert queue.headers() == []
    call_command("run_cron_task", "chain-transform", at=at)
    load_id = CronJob.objects.get(code="C103").id
    (first,) = of(load_id, dt.datetime(2026, 11, 29, 5, tzinfo=dt.UTC))
    [sent] = queue.headers()
    assert (sent[tasks.HEADER_EXECUTION], sent[tasks.HEADER_TRIGGER]) == (first.id, Trigger.UPSTREAM)
    call_command("run_cron_task", "chain-transform", at=at, rerun=True)  # no cascade: nothing more
    assert len(of(load_id, dt.datetime(2026, 11, 29, 5, tzinfo=dt.UTC))) == 1
    CronExecution.objects.filter(id=first.id).update(status=Status.SUCCEEDED, completed=True, success=True)
    call_command("run_cron_task", "chain-transform", at=at, rerun=True, cascade=True)
    loads = of(load_id, dt.datetime(2026, 11, 29, 5, tzinfo=dt.UTC))
    assert [(r.run_number, r.status, r.forced) for r in loads] == [(1, Status.SUCCEEDED, False),
                                                                   (2, Status.PENDING, True)]
    assert [h[tasks.HEADER_EXECUTION] for h in queue.headers()][-1] == loads[1].id


def test_a_run_looks_for_downstream_executions_only_when_a_job_runs_after_its_job():
    """Found by the overhead benchmark: every successful run of every job queried for downstream
    executions to send (a third statement per run of any job; this failed on f019c2e)."""
    from django.test.utils import CaptureQueriesContext

    from tests.jobsapp import jobs_chain
    from tests.jobsapp import tasks as plain

    lone = plain.fast_always
    lone(slot="2026-11-29T07:00:00Z")  # the job's row exists: the runs below are steady state
    with CaptureQueriesContext(connection) as queries:
        lone(slot="2026-11-29T07:01:00Z")
    assert not [q for q in queries if "upstream_execution_id" in q["sql"]]
    assert registry.has_downstream("chain-transform") and not registry.has_downstream(lone.job.name)
    dependencies.sync([jobs_chain.chain_extract.job, jobs_chain.chain_transform.job, jobs_chain.chain_load.job])
    with CaptureQueriesContext(connection) as queries:
        jobs_chain.chain_transform(slot="2026-11-29T07:00:00Z")
    assert [q for q in queries if "upstream_execution_id" in q["sql"]]


# --- alert_on_upstream, and the announcement of the skips the database writes ---------------------

#: The failure channels of the chain's jobs: up -> mid -> low (see ``alerting_chain``).
CHANNELS = {"dep-up": ["telegram"], "dep-mid": ["email", "webhook"], "dep-low": ["slack"]}


def alerting_chain(declare, *, mid: bool = True, low: bool = True, edges: bool = True,
                   **up_options: object) -> dict[str, tuple[registry.Job, int]]:
    """up (hourly) -> mid -> low, each with its own failure channels (``CHANNELS``); ``mid`` and
    ``low``: whether that job is declared with ``alert_on_upstream=True``."""
    made = {
        "up": declare("dep-up", "DU1", schedule=HOURLY, notify={"on_failure": CHANNELS["dep-up"]}, **up_options),
        "mid": declare("dep-mid", "DU2", after="dep-up", notify={"on_failure": CHANNELS["dep-mid"]},
                       **({"alert_on_upstream": True} if mid else {})),
        "low": declare("dep-low", "DU3", after="dep-mid", notify={"on_failure": CHANNELS["dep-low"]},
                       **({"alert_on_upstream": True} if low else {})),
    }
    ids = job_rows.refresh_job_ids(list(made.values()))
    if edges:
        dependencies.sync(list(made.values()))
    return {key: (job, ids[job.code]) for key, job in made.items()}


def _raise(run: runs.Run) -> None:
    raise ConnectionError("partner down")


def _time_out(run: runs.Run) -> None:
    raise SoftTimeLimitExceeded()


def _ok(run: runs.Run) -> str:
    return "fine"


def downstream_skips() -> list[CronExecution]:
    """Every execution the database skipped because of an upstream (reason UPSTREAM)."""
    return list(CronExecution.objects.filter(skip_reason=SkipReason.UPSTREAM).order_by("id"))


def alerts_of(execution_ids: list[int]) -> list[tuple[int, str, str]]:
    return list(Alert.objects.filter(execution_id__in=execution_ids).order_by("execution_id", "channel")
                .values_list("execution_id", "event", "channel"))


@pytest.fixture
def skipped_signals() -> Iterator[list[dict[str, Any]]]:
    """What ``execution_skipped`` receivers get during the test, and how many UPSTREAM alert rows
    were committed when each was sent (``alerts_committed``)."""
    received: list[dict[str, Any]] = []

    def receiver(sender: str, **kwargs: Any) -> None:
        received.append({"sender": sender, **{key: value for key, value in kwargs.items() if key != "signal"},
                         "alerts_committed": Alert.objects.filter(event="UPSTREAM").count()})

    signals.execution_skipped.connect(receiver, weak=False)
    yield received
    signals.execution_skipped.disconnect(receiver)


def test_alert_on_upstream_is_a_bool_for_a_job_declared_with_after(declare):
    assert declare("dep-on", "DO1", after="dep-up", alert_on_upstream=True).alert_on_upstream is True
    assert declare("dep-off", "DO2", after="dep-up").alert_on_upstream is False
    assert declare("dep-plain", "DO3", schedule=HOURLY, alert_on_upstream=False).alert_on_upstream is False
    with pytest.raises(exceptions.ImproperlyDeclared, match="alert_on_upstream is for a job declared with after="):
        registry.declare(name="dep-x", code="DXX", task_name="t", schedule=HOURLY, alert_on_upstream=True)
    for bad in ("yes", 1, None):
        with pytest.raises(exceptions.ImproperlyDeclared,
                           match=f"alert_on_upstream must be True or False, not {bad!r}"):
            registry.declare(name="dep-x", code="DXX", task_name="t", after="dep-up", alert_on_upstream=bad)
    # Both decorators take it as a job option, not as a Celery task option.
    rest, policy = decorators._split_options("dep-x", {"alert_on_upstream": True, "queue": "q"})
    assert (rest, policy) == ({"queue": "q"}, {"alert_on_upstream": True})
    with pytest.raises(exceptions.ImproperlyDeclared, match="alert_on_upstream is for a job declared with after="):
        decorators.cron_task(name="dep-y", code="DXY", alert_on_upstream=True)(_ok)
    assert "dep-y" not in {job.name for job in registry.all_jobs()}


def test_an_upstream_failure_alerts_each_opted_in_job_down_the_chain_once_per_channel_in_its_final_write(
        declare, skipped_signals):
    jobs_ = alerting_chain(declare)
    up = jobs_["up"][0]
    seen_at_commit: list[list[tuple[int, str, str]]] = []

    def at_commit(sender: str, execution_id: int, **kwargs: Any) -> None:
        # The upstream's own announcement, right after its final write committed: the downstream
        # executions' alert rows are already there (they committed with it).
        if sender == up.name:
            seen_at_commit.append(alerts_of([r.id for r in downstream_skips()]))

    signals.execution_failed.connect(at_commit, weak=False)
    try:
        failed = runs.execute(up, SLOT, _raise, trigger=Trigger.MANUAL)
    finally:
        signals.execution_failed.disconnect(at_commit)
    assert failed.status == Status.FAILED and failed.execution_id is not None
    mid, low = downstream_skips()
    assert (mid.job_id, mid.upstream_execution_id, low.job_id, low.upstream_execution_id) == (
        jobs_["mid"][1], failed.execution_id, jobs_["low"][1], mid.id)
    expected = [(mid.id, "UPSTREAM", "email"), (mid.id, "UPSTREAM", "webhook"), (low.id, "UPSTREAM", "slack")]
    assert alerts_of([mid.id, low.id]) == expected
    assert seen_at_commit == [expected]  # committed with the upstream's final write, before any announcement
    # The upstream's own alert is as before; the downstream jobs' incidents are left alone.
    assert alerts_of([failed.execution_id]) == [(failed.execution_id, "FAILED", "telegram")]
    assert list(CronJob.objects.filter(id__in=[mid.job_id, low.job_id]).values_list("alerted_at", flat=True)) == [
        None, None]
    # What the channels say: the skip, and the upstream failure that stopped the chain.
    message = delivery.message_for(Alert.objects.get(execution_id=low.id))
    assert message.title == "[cron] dep-low (DU3) was skipped: an upstream job failed"
    assert (message.status, message.error_code, message.failing) == (Status.SKIPPED, "UPSTREAM", True)
    assert message.error == (
        f"Skipped: upstream job dep-mid (DU2) ended SKIPPED, UPSTREAM in this slot (execution {mid.id}).\n"
        f"Upstream failure: dep-up (DU1), execution {failed.execution_id}, ended FAILED: "
        "ConnectionError: partner down")
    # And each skip was announced once, after the commit.
    assert [(s["sender"], s["execution_id"], s["error_code"], s["alerts_committed"]) for s in skipped_signals] == [
        ("dep-mid", mid.id, "UPSTREAM", 3), ("dep-low", low.id, "UPSTREAM", 3)]


class _Dies(BaseException):
    """The process ends (a kill): nothing after the commit runs."""


class _DieAtTheCommit(events.Listener):
    """Registers, inside the upstream's final write, a commit hook that ends everything there."""

    name = "dies-at-the-commit"

    def records(self, ended: events.Ended) -> bool:
        return ended.job is not None and ended.job.name == "dep-up"

    def record(self, ended: events.Ended) -> None:
        transaction.on_commit(self._die)

    @staticmethod
    def _die() -> None:
        raise _Dies()


def test_the_downstream_alerts_commit_with_the_upstreams_final_write_when_the_process_dies_at_the_commit(
        declare, skipped_signals):
    """Nothing that runs after the commit (its hooks, the announcements) is needed for the alerts."""
    jobs_ = alerting_chain(declare)
    events.subscribe(_DieAtTheCommit())
    try:
        with pytest.raises(_Dies):
            runs.execute(jobs_["up"][0], SLOT, _raise, trigger=Trigger.MANUAL)
    finally:
        events.unsubscribe(_DieAtTheCommit.name)
    mid, low = downstream_skips()
    assert alerts_of([mid.id, low.id]) == [(mid.id, "UPSTREAM", "email"), (mid.id, "UPSTREAM", "webhook"),
                                           (low.id, "UPSTREAM", "slack")]
    assert set(Alert.objects.filter(execution_id__in=[mid.id, low.id]).values_list("status", flat=True)) == {
        "PENDING"}  # the reconciler delivers them (its redelivery of PENDING rows)
    assert skipped_signals == []  # nothing after the commit ran


def test_a_downstream_job_that_did_not_opt_in_stays_silent_and_one_below_it_that_did_alerts(declare):
    jobs_ = alerting_chain(declare, mid=False, low=True)
    failed = runs.execute(jobs_["up"][0], SLOT, _raise, trigger=Trigger.MANUAL)
    assert failed.execution_id is not None
    mid, low = downstream_skips()
    assert alerts_of([mid.id, low.id]) == [(low.id, "UPSTREAM", "slack")]
    assert alerts_of([failed.execution_id]) == [(failed.execution_id, "FAILED", "telegram")]


def test_execution_skipped_is_sent_once_for_each_downstream_slot_the_database_skipped(declare, skipped_signals):
    """No job opts in to alerts here: the signal is sent for every skip the trigger wrote."""
    jobs_ = chain(declare)
    failed = run_through_outcomes(*jobs_["extract"], status=Status.FAILED)
    load, report = downstream_skips()
    assert skipped_signals == [
        {"sender": "dep-load", "job": "dep-load", "code": "DX3", "execution_id": load.id, "slot": SLOT,
         "status": Status.SKIPPED, "error_code": SkipReason.UPSTREAM, "message": load.message,
         "alerts_committed": 0},
        {"sender": "dep-report", "job": "dep-report", "code": "DX4", "execution_id": report.id, "slot": SLOT,
         "status": Status.SKIPPED, "error_code": SkipReason.UPSTREAM, "message": report.message,
         "alerts_committed": 0},
    ]
    assert load.upstream_execution_id == failed
    run_through_outcomes(*jobs_["transform"])  # decides nothing more: nothing more is announced
    assert len(skipped_signals) == 2


def run_through_outcomes(job: registry.Job, job_id: int, status: str = Status.SUCCEEDED) -> int:
    """``run``, with the final write through ``outcomes`` (what the listeners hear of)."""
    execution_id, _ = dispatch.enqueue(job=job, job_id=job_id, slot=SLOT, execution_date=SLOT.date(),
                                       trigger=Trigger.ENQUEUE, forced=True)
    claim = begin(job, job_id, SLOT, execution_id=execution_id, trigger=Trigger.ENQUEUE)
    assert claim.fence is not None
    assert outcomes.finish(job, job_id, execution_id, SLOT, fence=claim.fence, status=status, message="",
                           error_code="", traceback="", result=None)
    return execution_id


# Each way an upstream execution ends, as its writer does it: (how, alerts the opted-in jobs below).

HOURLY_GAP = dt.timedelta(hours=1)


def _worker_failed(up: registry.Job, up_id: int) -> None:
    assert runs.execute(up, SLOT, _raise, trigger=Trigger.MANUAL).status == Status.FAILED


def _worker_timed_out(up: registry.Job, up_id: int) -> None:
    assert runs.execute(up, SLOT, _time_out, trigger=Trigger.MANUAL).status == Status.TIMED_OUT


def _parent_lost(up: registry.Job, up_id: int) -> None:
    claim = begin(up, up_id, SLOT, trigger=Trigger.BEAT, worker="w", pid=4242)
    ended = outcomes.dead(up, job_id=up_id, status=Status.LOST, error_code="WORKER_LOST",
                          message="the child died (signal 9)", worker="w", pid=4242, execution_id=claim.execution_id)
    assert ended is not None and ended.status == Status.LOST


def _lease_expired(up: registry.Job, up_id: int) -> None:
    claim = begin(up, up_id, SLOT, trigger=Trigger.BEAT)
    expire_lease(claim.execution_id)
    with override_settings(CRON_CELERY={"RECONCILE": RECONCILE}):
        assert reconciler.run_pass().lost == 1


def _never_started(status: str) -> Callable[[registry.Job, int], None]:
    def end(up: registry.Job, up_id: int) -> None:
        execution_id, _ = dispatch.enqueue(job=up, job_id=up_id, slot=SLOT, execution_date=SLOT.date(),
                                           trigger=Trigger.BEAT)
        assert outcomes.unstarted(up, job_id=up_id, execution_id=execution_id, slot=SLOT, status=status,
                                  error_code="NOT_DELIVERED", message="no worker received it")
    return end


def _given_up(up: registry.Job, up_id: int) -> None:
    claim = begin(up, up_id, SLOT, trigger=Trigger.BEAT)
    assert claim.execution_id is not None and claim.fence is not None
    assert finishes.retry(job_id=up_id, execution_id=claim.execution_id, fence=claim.fence, status=Status.FAILED,
                          message="boom", error_code="Boom", traceback="", countdown=0)
    CronJob.objects.filter(id=up_id).update(paused=True)
    given = outcomes.given_up(up, job_id=up_id, execution_id=claim.execution_id, note="not retried: paused")
    assert given is not None and given.status == Status.FAILED


def _revoked(up: registry.Job, up_id: int) -> None:
    execution_id, _ = dispatch.enqueue(job=up, job_id=up_id, slot=SLOT, execution_date=SLOT.date(),
                                       trigger=Trigger.BEAT)
    assert outcomes.revoked(up, job_id=up_id, message="revoked by a person", execution_id=execution_id)


def _skipped_paused(up: registry.Job, up_id: int) -> None:
    CronJob.objects.filter(id=up_id).update(paused=True)
    assert runs.execute(up, SLOT, _ok, trigger=Trigger.BEAT).skip_reason == SkipReason.PAUSED


def _outage(up: registry.Job, up_id: int) -> None:
    """The beat back after an outage: two slots recorded MISSED in one statement, then recorded."""
    missed = [SLOT - dt.timedelta(hours=1), SLOT]
    dispatch.dispatch_many([dispatch.Decision(job_id=up_id, expected_next_run_at=None, next_run_at=SLOT + HOURLY_GAP,
                                              run=[], missed=missed, tz=dt.UTC)])
    assert outcomes.missed(repairs.newest_missed([up_id])) == 1


def _decided_late(up: registry.Job, up_id: int) -> None:
    """The upstream failed before the edges existed (a deploy added them); the reconciler decides."""
    assert runs.execute(up, SLOT, _raise, trigger=Trigger.MANUAL).status == Status.FAILED
    assert downstream_skips() == []
    dependencies.sync(registry.all_jobs())
    CronJob.objects.exclude(id=up_id).update(created_at=SLOT - dt.timedelta(days=1))
    CronExecution.objects.filter(job_id=up_id).update(ended=db_now() - dt.timedelta(minutes=2))
    with override_settings(CRON_CELERY={"RECONCILE": RECONCILE}):
        assert reconciler.run_pass().downstream == 1


ENDINGS = {
    "worker-failed": (_worker_failed, True),
    "worker-timed-out": (_worker_timed_out, True),
    "parent-lost": (_parent_lost, True),
    "lease-expired": (_lease_expired, True),
    "never-delivered": (_never_started(Status.LOST), True),
    "given-up": (_given_up, True),
    "decided-late": (_decided_late, True),
    "revoked": (_revoked, False),  # somebody stopped it on purpose
    "never-started-missed": (_never_started(Status.MISSED), False),  # no failure of the job
    "outage": (_outage, False),
    "skipped-paused": (_skipped_paused, False),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_every_writer_of_an_upstreams_end_announces_the_skips_below_it_once_and_alerts_for_failures(
        declare, skipped_signals, ending):
    end, alerting = ENDINGS[ending]
    jobs_ = alerting_chain(declare, edges=ending != "decided-late", max_retries=1 if ending == "given-up" else 0)
    end(*jobs_["up"])
    skips = downstream_skips()
    slots = 2 if ending == "outage" else 1
    assert [r.job_id for r in skips].count(jobs_["mid"][1]) == slots
    assert [r.job_id for r in skips].count(jobs_["low"][1]) == slots
    below = [s for s in skipped_signals if s["sender"] != "dep-up"]  # a paused upstream's own skip is sent too
    assert sorted(s["execution_id"] for s in below) == [r.id for r in skips]
    assert {(s["status"], s["error_code"]) for s in below} == {(Status.SKIPPED, SkipReason.UPSTREAM)}
    names = {jobs_["mid"][1]: "dep-mid", jobs_["low"][1]: "dep-low"}
    expected = sorted((r.id, "UPSTREAM", channel) for r in skips for channel in CHANNELS[names[r.job_id]])
    assert alerts_of([r.id for r in skips]) == (expected if alerting else [])
    # Committed with the skips, before the first of them was announced.
    assert below[0]["alerts_committed"] == len(expected if alerting else [])


def test_a_failed_run_looks_for_skipped_downstream_executions_only_when_a_job_runs_after_its_job(declare):
    """A plain job's failure costs no statement more than its success; an upstream's failure asks."""
    from django.test.utils import CaptureQueriesContext

    lone = declare("dep-lone", "DL1", schedule=HOURLY, pattern="always")
    jobs_ = alerting_chain(declare, pattern="always")
    runs.execute(lone, SLOT, _ok, trigger=Trigger.MANUAL)  # the job's row exists: the runs below are steady state
    with CaptureQueriesContext(connection) as succeeded:
        runs.execute(lone, SLOT, _ok, trigger=Trigger.MANUAL)
    with CaptureQueriesContext(connection) as failed:
        assert runs.execute(lone, SLOT, _raise, trigger=Trigger.MANUAL).status == Status.FAILED
    assert len(failed) == len(succeeded)
    assert not [q for q in failed if "upstream_execution_id" in q["sql"]]
    with CaptureQueriesContext(connection) as upstream:
        assert runs.execute(jobs_["up"][0], SLOT, _raise, trigger=Trigger.MANUAL).status == Status.FAILED
    assert [q for q in upstream if "upstream_execution_id" in q["sql"]]


def test_a_run_the_broker_refused_skips_the_slot_below_it_and_says_so(declare, skipped_signals):
    """``send_run`` closes a PENDING upstream execution the broker refused (FAILED, PUBLISH_FAILED):
    the trigger skips the downstream slot, and that skip is announced like any other upstream's end
    (before: no ``execution_skipped`` for it, the closing went past ``outcomes``)."""
    jobs_ = chain(declare)
    extract, extract_id = jobs_["extract"]
    execution_id, _number = dispatch.enqueue(job=extract, job_id=extract_id, slot=SLOT,
                                             execution_date=SLOT.date(), trigger=Trigger.ENQUEUE)
    outcomes.unsent(extract, execution_id, "Could not send the run to the broker: refused")
    assert row(execution_id).error_code == "PUBLISH_FAILED"
    skipped = {r.task_name: r.skip_reason for r in CronExecution.objects.filter(slot=SLOT, status=Status.SKIPPED)}
    assert skipped == {"dep-load": SkipReason.UPSTREAM, "dep-report": SkipReason.UPSTREAM}
    assert sorted(s["sender"] for s in skipped_signals) == ["dep-load", "dep-report"]
