"""``overlap="buffer_one"`` on real processes: two real beats, a real prefork worker (two processes,
so two runs could overlap if the claim let them), real PostgreSQL and Redis. A 5 s body every 2 s:
the runs never overlap, each one after the first that could not start on time waited behind the live
run instead of being skipped, the other slots are skipped saying the buffer is full, every body ran
once, and nothing is left open."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import pytest

from cron_celery.decisions import room
from cron_celery.models import CronExecution, SkipReason, Status, Trigger
from tests.conftest import marked, wait_for
from tests.faults.test_beat import cluster, start_beat, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_one_slot_waits_behind_the_live_run_and_the_others_are_skipped(tmp_path: Path, marker: Path) -> None:
    with cluster(tmp_path, marker, workers=1, CRON_TEST_BUFFER_ONE="1") as env:
        beats = [start_beat(tmp_path, env, index) for index in (0, 1)]
        try:
            wait_for(lambda: CronExecution.objects.filter(task_code="BO1", status=Status.SUCCEEDED).count() >= 3,
                     timeout=120, what="three runs of buffers-one")
        finally:
            for beat in beats:
                stop(beat)
    rows = list(CronExecution.objects.filter(task_code="BO1").order_by("slot", "id"))
    assert {row.trigger for row in rows} == {Trigger.BEAT}, [(row.slot, row.trigger) for row in rows]
    assert all(row.completed for row in rows), [(row.id, row.status) for row in rows if not row.completed]
    ran = [row for row in rows if row.status == Status.SUCCEEDED]
    skipped = [row for row in rows if row.status == Status.SKIPPED]
    assert len(ran) + len(skipped) == len(rows), [(row.id, row.status, row.message) for row in rows]
    for before, after in itertools.pairwise(ran):
        assert after.started is not None and before.ended is not None and after.started >= before.ended, (
            f"two runs at once: {before.id} ended {before.ended}, {after.id} started {after.started}")
    # Every run after the first was kept from its slot by the live one (5 s body, 2 s slots), and waited
    # for it rather than being skipped.
    waited = [row for row in ran[1:] if row.started is not None and row.started - row.slot > dt.timedelta(seconds=2)]
    assert waited, [(row.slot, row.started) for row in ran]
    # OVERLAP, or LOCK_UNAVAILABLE when the live run's Redis lock answered first (as with overlap "skip").
    assert skipped and all(row.skip_reason in (SkipReason.OVERLAP, SkipReason.LOCK_UNAVAILABLE)
                           and row.message == room.BUFFER_FULL_MESSAGE for row in skipped), (
        [(row.skip_reason, row.message) for row in skipped])
    for row in ran:
        key = f"BO1:{row.slot.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%S}Z"
        assert len([line for line in marked(marker) if line.startswith(f"buffers-one {key} ")]) == 1, key
