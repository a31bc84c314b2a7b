"""What must be true of the rows for each feature the features model test walks
(tests/model/test_features_model.py), written from docs/concepts.md, not from the SQL.

The claim protocol's model (``reference.py``) predicts every row; here each feature states the
properties its rows keep whatever happened, checked after every step (``check``), after every beat
round (``check_round``) and once everything is delivered, ended and reconciled (``check_drained``):

- **limits**: an exclusive job never has two live runs, ``g2`` never more than its ``max_concurrency``,
  the group ``modelgroup`` never more than its limit across its jobs;
- **fences**: no two claims of a job share a fence;
- **slot checks**: a slot of a ``standard`` job succeeds at most once, runs with parameters and
  forced runs aside (a run with parameters is its own execution, beside the slot's);
- **one-offs**: a cancelled one-off never runs; a one-off is one execution, claimed at most its
  attempts;
- **removed jobs**: a job removed from the code gets no new row while it is removed;
- **after=**: a downstream run starts only when every upstream succeeded in its slot; once drained,
  every slot an upstream has a decided execution of ends in a recorded decision downstream;
- **windows, pauses, one_off**: a beat round records slots only inside the job's window, never for a
  paused job (but the forced last slot of a ``one_off``), never beyond the clock;
- **the catch-up window**: a beat round records a slot older than the job's ``catch_up_window``
  ``MISSED`` and sends every newer one (``up2``: ``all``);
- **the slot stream**: a job nobody paused, edited or removed has one beat row for each of its
  slots up to the clock: none lost, none twice;
- **timing alerts**: ``LATE`` and ``LONG_RUNNING`` at most once per execution, and a marked run has
  its alert;
- **the broker away**: a reconciler pass that cannot reach the broker closes no run that waits to
  start (it cannot know that its message was lost);
- **pauses**: a pause whose end has passed is over once a beat round or a reconciler pass has run
  (``check_pause_ends``); a job that paused itself (``par``: ``pause_after_failures=2``) had that many
  final failures in a row, the newest ending when it paused, and no success between them.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt

from tests.model import features_harness as fh

OPEN = ("PENDING", "RUNNING", "RETRYING")
EXCLUSIVE = ("up1", "up2", "down", "tail", "par", "jit")
SLOT_CHECKED = ("up1", "down", "par")
BEAT_TRIGGERS = ("BEAT", "CATCH_UP")
#: The runs the schedule makes: the beat's slots and one-off runs (a downstream run is judged by the run its
#: chain started from: a slot somebody ran by hand waits for the other upstreams' runs of it, by hand too).
SCHEDULED = ("BEAT", "CATCH_UP", "ONE_OFF")


@dataclasses.dataclass
class Known:
    """What the test did that the rows must answer for."""

    base: dt.datetime
    now: dt.datetime  # the virtual clock of the latest beat round
    removed: dict[str, int] = dataclasses.field(default_factory=dict)  # key -> the newest execution id then
    ever_removed: set[str] = dataclasses.field(default_factory=set)
    cancelled: set[int] = dataclasses.field(default_factory=set)  # one-offs whose cancel returned them
    disturbed: set[str] = dataclasses.field(default_factory=set)  # paused, edited or removed once


def _by_job(world: fh.World, rows: list[fh.Row]) -> dict[str, list[fh.Row]]:
    found: dict[str, list[fh.Row]] = collections.defaultdict(list)
    for row in rows:
        found[world.key_of_id(row.job_id)].append(row)
    return found


def check(world: fh.World, known: Known) -> list[fh.Row]:
    """The properties that hold after every step; returns the rows read."""
    rows = fh.rows()
    mine = _by_job(world, rows)
    for key in EXCLUSIVE:
        live = [row.id for row in mine[key] if row.live]
        assert len(live) <= 1, f"{key}: two live runs of an exclusive job: {live}"
    live_g2 = [row.id for row in mine["g2"] if row.live]
    assert len(live_g2) <= 1, f"g2: more live runs than its max_concurrency: {live_g2}"
    group = [row.id for key in ("g1", "g2") for row in mine[key] if row.live]
    assert len(group) <= fh.GROUP_LIMIT, f"the group has {len(group)} live runs: {group}"
    for key, found in mine.items():
        fences = [fence for row in found for fence in row.claims]
        assert len(fences) == len(set(fences)), f"{key}: two claims got one fence: {sorted(fences)}"
        job = world.declared[key]
        for row in found:
            assert len(row.claims) <= job.max_retries + 1, f"execution {row.id} claimed {len(row.claims)} times"
            if row.status == "SKIPPED":
                assert not row.claims, f"execution {row.id} ran and ended SKIPPED"
    for key in SLOT_CHECKED:
        won = collections.Counter(row.slot for row in mine[key]
                                  if row.status == "SUCCEEDED" and not row.forced and not row.params_given)
        assert all(count <= 1 for count in won.values()), f"{key}: a slot succeeded twice: {won}"
    by_id = {row.id: row for row in rows}
    for execution_id in known.cancelled:
        row = by_id[execution_id]
        assert row.status == "SKIPPED" and not row.claims, f"cancelled one-off {execution_id} is {row}"
    for key, newest in known.removed.items():
        late = [row.id for row in mine[key] if row.id > newest]
        assert not late, f"{key} was removed from the code and got new rows {late}"
    for down, ups in fh.UPSTREAMS.items():
        counted = [up for up in ups if up not in known.ever_removed]
        succeeded = {up: {row.slot for row in mine[up] if row.status == "SUCCEEDED"} for up in counted}
        for row in mine[down]:
            if row.claims and row.trigger == "UPSTREAM":
                missing = [up for up in counted if row.slot not in succeeded[up]]
                assert not missing, f"{down} execution {row.id} ran before {missing} succeeded in slot {row.slot}"
    _check_alerts(rows)
    return rows


def _check_alerts(rows: list[fh.Row]) -> None:
    counted = collections.Counter((execution_id, event) for _job, execution_id, event in fh.alerts()
                                  if event in ("LATE", "LONG_RUNNING"))
    twice = {key: count for key, count in counted.items() if count > 1}
    assert not twice, f"timing alerts sent more than once: {twice}"
    for row in rows:
        if row.late_alerted:
            assert (row.id, "LATE") in counted, f"execution {row.id} marked late without its alert"
        if row.long_alerted:
            assert (row.id, "LONG_RUNNING") in counted, f"execution {row.id} marked long without its alert"


def check_round(world: fh.World, known: Known, before: int) -> None:
    """What a beat round at ``known.now`` recorded (the rows newer than ``before``)."""
    jobs = fh.job_rows()
    for row in fh.rows():
        if row.id <= before or not (row.trigger in BEAT_TRIGGERS or row.status == "MISSED"):
            continue
        key = world.key_of_id(row.job_id)
        job = jobs[row.job_id]
        assert row.slot <= known.now, f"{key}: slot {row.slot} recorded before the clock reached it"
        assert not job.removed, f"{key} is removed and the beat recorded slot {row.slot}"
        assert not job.paused or row.force, f"{key} is paused and the beat recorded slot {row.slot} ({row.status})"
        assert job.active_from is None or row.slot >= job.active_from, (
            f"{key}: slot {row.slot} before its window opens at {job.active_from}")
        assert job.active_until is None or row.slot < job.active_until, (
            f"{key}: slot {row.slot} at or after its window's end {job.active_until}")
        window = world.declared[key].catch_up_window
        if window is not None and not row.force:
            old = row.slot < known.now - dt.timedelta(seconds=window)
            assert (row.status == "MISSED") == old, (
                f"{key}: slot {row.slot} recorded {row.status} at {known.now}, its catch-up window is {window:g} s")


def check_stream(world: fh.World, known: Known, rows: list[fh.Row]) -> None:
    """Jobs nobody disturbed have one beat row per slot up to the clock (a jittered one's last slot
    may not be due yet)."""
    mine = _by_job(world, rows)
    for key, job in world.declared.items():
        if key in known.disturbed or job.schedule is None:
            continue
        beat = collections.Counter(row.slot for row in mine[key]
                                   if row.trigger in BEAT_TRIGGERS or (row.status == "MISSED"))
        twice = [slot for slot, count in beat.items() if count > 1]
        assert not twice, f"{key}: slots recorded twice by the beat: {twice}"
        hours = int((known.now - known.base) / fh.HOUR)
        expected = {known.base + k * fh.HOUR for k in range(hours + 1)}
        # A slot that already had a run (sent or run by a person) is not recorded again by the beat.
        missing = sorted(expected - {row.slot for row in mine[key]})
        if job.jitter:
            missing = [slot for slot in missing if slot < known.now - fh.HOUR + dt.timedelta(seconds=1)]
        assert not missing, f"{key}: slots up to {known.now} the beat never recorded: {missing}"


def check_pause_ends() -> None:
    """After a beat round or a reconciler pass, no pause whose end passed is left (nothing holds a job's
    row across the rules that run them)."""
    left = fh.pauses_left_behind()
    assert not left, f"pauses whose end passed, still in effect after a round or a pass: {left}"


def check_self_pauses(world: fh.World, known: Known) -> None:
    """A job paused by its own failures: ``pause_after_failures`` final failures in a row up to its pause.
    A job that did is disturbed (its stream has a gap)."""
    for job_id, paused_at in fh.self_paused().items():
        key = world.key_of_id(job_id)
        known.disturbed.add(key)
        limit = world.declared[key].pause_after_failures
        assert limit is not None, f"{key} paused itself without pause_after_failures"
        newest = fh.outcomes_before(job_id, paused_at, limit)
        assert len(newest) == limit and "SUCCEEDED" not in newest, (
            f"{key} paused itself at {paused_at} after {newest} (its newest final outcomes then)")


def check_broker_pass(before: list[fh.Row], after: list[fh.Row]) -> None:
    """A pass that could not reach the broker closed nothing that waited to start."""
    now = {row.id: row for row in after}
    closed = [(row.id, now[row.id].status) for row in before
              if row.status in ("PENDING", "RETRYING") and now[row.id].status not in OPEN]
    assert not closed, f"a pass without a broker closed waiting runs: {closed}"


def check_drained(world: fh.World, known: Known, rows: list[fh.Row]) -> None:
    """Everything delivered, ended, expired and reconciled: nothing open, and every slot an upstream
    decided has its downstream decision."""
    still_open = [(row.id, world.key_of_id(row.job_id), row.status, row.trigger) for row in rows
                  if row.status in OPEN]
    assert not still_open, f"open after everything was delivered and reconciled: {still_open}"
    mine = _by_job(world, rows)
    by_id = {row.id: row for row in rows}
    for down, ups in fh.UPSTREAMS.items():
        if down in known.ever_removed:
            continue
        decided_below = {row.slot for row in mine[down]}
        for up in ups:
            if up in known.ever_removed:
                continue
            for row in mine[up]:
                # A slot the schedule made (a run somebody asked for may wait for the others' runs of it).
                if (row.status == "SUCCEEDED" and not row.params_given and root_trigger(row, by_id) in SCHEDULED
                        and row.slot < known.now - fh.HOUR):
                    assert row.slot in decided_below, (
                        f"{up} succeeded in slot {row.slot} (execution {row.id}, {row.trigger}) and {down} has no"
                        f" decision for it: {describe(world, rows, row.slot)}")


def root_trigger(row: fh.Row, by_id: dict[int, fh.Row]) -> str:
    """The trigger of the run a downstream run's chain started from (``UPSTREAM`` rows up to the top)."""
    while row.trigger == "UPSTREAM" and row.upstream_execution_id in by_id:
        row = by_id[row.upstream_execution_id]
    return row.trigger


def describe(world: fh.World, rows: list[fh.Row], slot: dt.datetime) -> str:
    """Every execution of one slot, across the jobs: what a failure message shows."""
    return "; ".join(f"{world.key_of_id(row.job_id)} #{row.id} run {row.run_number} {row.trigger} {row.status}"
                     f" {row.skip_reason}".strip() for row in rows if row.slot == slot) + f"; edges {fh.edges(world)}"
