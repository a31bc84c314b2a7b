"""What each newer feature must keep in the soak's history (docs/concepts.md says why each holds):

- the fan-in (``after=``): every slot an upstream has an execution of ends in one decision of the
  downstream: it ran when every upstream's run of the slot succeeded, else it is skipped UPSTREAM;
- the concurrency group: never more live runs of its jobs than its limit, by the rows and by the
  bodies' own lines; a beat's slot skipped for it met a live run of the group;
- jitter: each beat slot is due its job's offset after the slot, and no run starts before that;
- the window: no slot outside it, not even MISSED;
- parameters: every body got values its job takes, the values on its row; a scheduled run got
  the kwargs in effect when its slot was recorded (a refused edit changed nothing);
- the person's one-off runs ran at most once, at or after their time, and a cancelled one never;
  the person's runs with values are their own executions;
- the tracked plain task: every recorded success was its body's, under a claim; nothing ran untracked;
- the paused upstream, and the job that pauses itself after its failures: no beat slot recorded while
  it was paused (a pause with an end lasts until then);
- the run before: each body was told (``run.previous``, ``run.last_success``) the newest execution
  before it, by slot and run number, that had started and ended (succeeded) when its claim was made.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.soak import spec as specs
from tests.soak.history import BODY_STATUSES, OPEN, Result, Row

#: Seconds an edit may take to reach the beat (it reads edits at every tick of about a second).
EDIT_LAG = 3.0
DEFAULTS = {"region": "eu", "n": 0}
FEATURE_SKIPS = ("UPSTREAM", "CONCURRENCY", "CANCELLED", "PAUSED")
#: Seconds between a final write's end time (its statement's clock) and what a claim's snapshot sees:
#: an execution that ended this long before a claim was seen by it; one ended after it, was not.
SEEN_SLACK = 2.0
#: The statuses of executions that ran and ended (``run.previous``), and of successes.
RAN = ("SUCCEEDED", "FAILED", "TIMED_OUT", "LOST", "REVOKED")


@dataclasses.dataclass
class Person:
    """What the soak's person did (tests/soak/person.py), from its ``person.jsonl``."""

    lines: list[dict[str, Any]]
    #: (job code, epoch seconds) of the pauses that ended by themselves, as the audit log dates them (the
    #: beats or the reconciler end a pause at their first look after its end: under faults, seconds late).
    pause_ends: list[tuple[str, float]] = dataclasses.field(default_factory=list)

    @classmethod
    def read(cls, markers: Path) -> Person:
        path = markers / "person.jsonl"
        if not path.exists():
            return cls([])
        return cls([json.loads(text) for text in path.read_text(encoding="utf-8").splitlines() if text])

    def of(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["ev"] == event]

    def pauses(self, code: str, *, certain: bool = False) -> list[tuple[float, float]]:
        """``code``'s pauses, from the line written before the save (a job that paused itself: from
        its ``paused_at``) to its resume, or to its end when it had one and that came first.
        ``certain``: only those whose save returned (a ``pause-failed`` save may or may not have
        committed)."""
        spans: list[tuple[float, float]] = []
        since: float | None = None
        sure, until = True, float("inf")
        for line in self.lines:
            if line.get("job") != code:
                continue
            if line["ev"] in ("pause", "self-paused"):
                if since is not None and until < line["t"]:  # the one before ended by itself
                    spans.append((since, until))
                since, sure, until = line.get("at", line["t"]), True, float("inf")
            elif line["ev"] == "pause-failed":
                sure = False
            elif line["ev"] == "pause-ends":
                until = self.ended_by_itself(code, line["until"])
            elif line["ev"] == "resume" and since is not None:
                if sure or not certain:
                    spans.append((since, min(until, line["t"])))
                since = None
        if since is not None and (sure or not certain):
            spans.append((since, until))
        return spans

    def ended_by_itself(self, code: str, until: float) -> float:
        """When a pause of ``code`` with this end did end by itself: the audit log's first such end at or
        after it (``until`` when none is recorded: a resume came first, or the pause is open)."""
        return min((moment for job, moment in self.pause_ends if job == code and moment >= until - 1.0),
                   default=until)

    def paused_between(self, code: str, before: float, after: float) -> bool:
        """Whether a pause of ``code`` (plus the beat's lag either side) lies between two slots."""
        return any(start - EDIT_LAG <= after and end + EDIT_LAG >= before for start, end in self.pauses(code))

    def paused_at(self, code: str, moment: float, *, lag: float = EDIT_LAG) -> bool:
        """A skip's moment is its transaction's start, which may come before the pause commits."""
        return any(start - lag <= moment <= end + lag for start, end in self.pauses(code))

    def cancelled(self) -> set[int]:
        return {line["exec"] for line in self.of("cancelled")}

    def maybe_cancelled(self) -> set[int]:
        """Cancels whose answer was a database error: the cancel may have committed or not."""
        return {line["exec"] for line in self.of("cancel-failed")}

    def kwargs_in_effect(self, moment: float) -> list[dict[str, Any]]:
        """The values a slot recorded at ``moment`` may have: the last good kwargs edit before it,
        or one made within EDIT_LAG before it together with those before that. An edit answered by a
        database error (``uncertain``) may or may not have committed: it adds its values, and only a
        later edit that saved replaces them."""
        allowed: list[dict[str, Any]] = [{}]
        for line in self.of("kwargs"):
            if not line["good"]:
                continue
            if line["t"] > moment:
                break
            if moment - line["t"] < EDIT_LAG or line.get("uncertain"):
                allowed = [*allowed, line["values"]]
            else:
                allowed = [line["values"]]
        return allowed


def decided_elsewhere(row: Row, person: Person) -> bool:
    """Rows the checker's general rules leave to this module."""
    if row.spec.tracked and row.status in BODY_STATUSES:
        return True
    return row.status == "SKIPPED" and row.skip_reason in FEATURE_SKIPS


Lines = dict[tuple[int, int], dict[str, Any]]


def check_all(rows: list[Row], starts: Lines, ends: Lines, tracked_lines: list[dict[str, Any]],
              person: Person, result: Result, *, jobs: dict[str, dict[str, Any]],
              window: tuple[float, float]) -> None:
    by_job: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_job[row.job].append(row)
    _skips(rows, person, result)
    _fan_in(by_job, result)
    _groups(rows, starts, ends, result)
    _jitter(by_job, jobs, result)
    _window(by_job, window, result)
    _params(by_job, starts, person, result)
    _person(rows, starts, person, result)
    _tracked(rows, tracked_lines, result)
    _paused(by_job, person, result)
    _told(rows, by_job, starts, result)


def _skips(rows: list[Row], person: Person, result: Result) -> None:
    cancelled = person.cancelled()
    for row in rows:
        if row.status != "SKIPPED" or row.skip_reason not in FEATURE_SKIPS:
            continue
        spec, reason = row.spec, row.skip_reason
        if reason == "UPSTREAM" and not spec.after:
            result.flag("BAD_SKIP", row, f"SKIPPED UPSTREAM although {row.job} runs after nothing")
        elif reason == "CANCELLED" and row.id not in cancelled | person.maybe_cancelled():
            result.flag("BAD_SKIP", row, "SKIPPED CANCELLED although nobody cancelled it")
        elif reason == "PAUSED" and not (row.ended and person.paused_at(row.job, row.ended.timestamp())):
            result.flag("BAD_SKIP", row, f"SKIPPED PAUSED at {row.ended} while {row.job} was not paused")
        elif reason == "CONCURRENCY":
            if not spec.group or row.trigger != "BEAT":
                result.flag("BAD_SKIP", row, f"a {row.trigger} execution of {row.job} (group {spec.group!r}) "
                            "SKIPPED CONCURRENCY: only a beat's slot of a group's job is skipped for it")
                continue
            moment = row.ended
            group = {code for code, other in specs.BY_CODE.items() if other.group == spec.group}
            # The skip's moment is its transaction's start; a frozen worker or a locked table may hold
            # it some seconds before it counts the group's runs.
            live = 0 if moment is None else sum(
                1 for other in rows if other.job in group and other.id != row.id and other.started is not None
                and other.started <= moment + dt.timedelta(seconds=10)
                and (other.ended is None or other.ended >= moment))
            if live < specs.GROUP_LIMITS[spec.group]:
                result.flag("SKIP_WITHOUT_LIVE_RUN", row, f"SKIPPED CONCURRENCY at {moment} while {live} run(s) "
                            f"of group {spec.group} (limit {specs.GROUP_LIMITS[spec.group]}) were live")


def _fan_in(by_job: dict[str, list[Row]], result: Result) -> None:
    """Each slot that an upstream has a run of ends in one decision below: run when every upstream's
    run of it succeeded, else skipped UPSTREAM."""
    for spec in specs.SPECS:
        if not spec.after:
            continue
        ups = {code: {row.slot: row for row in by_job.get(code, []) if row.scheduled} for code in spec.after}
        below: dict[dt.datetime, list[Row]] = defaultdict(list)
        for row in by_job.get(spec.code, []):
            if row.scheduled:
                below[row.slot].append(row)
        for slot in sorted(set().union(*(set(slots) for slots in ups.values()))):
            runs = {code: ups[code].get(slot) for code in spec.after}
            decided = below.get(slot, [])
            said = ", ".join(f"{code} {run.status if run else 'none'}" for code, run in runs.items())
            if not decided:
                result.flag("UNDECIDED_DOWNSTREAM", None, f"{spec.code} slot {slot:%H:%M:%S} has no decision "
                            f"({said})")
                continue
            ran = decided[0].status != "SKIPPED"
            should_run = all(run is not None and run.status == "SUCCEEDED" for run in runs.values())
            if ran != should_run:
                result.flag("FAN_IN_WRONG", decided[0], f"{spec.code} slot {slot:%H:%M:%S} "
                            f"{'ran' if ran else 'was skipped'} ({decided[0].status} {decided[0].skip_reason}) "
                            f"while its upstreams were: {said}")
        for slot, decided in below.items():
            if all(ups[code].get(slot) is None for code in spec.after):
                result.flag("FAN_IN_WRONG", decided[0], f"{spec.code} slot {slot:%H:%M:%S} was decided although "
                            "no upstream has a run of it")


Spans = list[tuple[float, float, int]]


def attempt_spans(rows: list[Row], starts: Lines, ends: Lines, codes: set[str]) -> tuple[Spans, Spans]:
    """The body-status attempts of these jobs, by the rows' clock and by the bodies' own lines."""
    recorded: Spans = []
    bodies: Spans = []
    for row in rows:
        if row.job not in codes:
            continue
        for attempt in row.claims():
            if attempt.get("status") not in BODY_STATUSES:
                continue
            if attempt.get("started") and attempt.get("ended"):
                recorded.append((attempt["started"].timestamp(), attempt["ended"].timestamp(), row.id))
            key = (row.id, attempt["fence"])
            if key in starts and key in ends:
                bodies.append((starts[key]["t"], ends[key]["t"], row.id))
    return recorded, bodies


def _groups(rows: list[Row], starts: Lines, ends: Lines, result: Result) -> None:
    for group, limit in specs.GROUP_LIMITS.items():
        codes = {spec.code for spec in specs.SPECS if spec.group == group}
        both = attempt_spans(rows, starts, ends, codes)
        for kind, spans in zip(("GROUP_EXCEEDED_ROWS", "GROUP_EXCEEDED_BODIES"), both, strict=True):
            events = sorted([(start, 1, ident) for start, _, ident in spans]
                            + [(end, -1, ident) for _, end, ident in spans])
            live: set[int] = set()
            for moment, step, ident in events:
                if step < 0:
                    live.discard(ident)
                    continue
                live.add(ident)
                if len(live) > limit:
                    result.flag(kind, ident, f"group {group}: {len(live)} runs live at once at "
                                f"{dt.datetime.fromtimestamp(moment, dt.UTC):%H:%M:%S.%f} (executions "
                                f"{sorted(live)}), its limit is {limit}")


def _jitter(by_job: dict[str, list[Row]], jobs: dict[str, dict[str, Any]], result: Result) -> None:
    for spec in specs.SPECS:
        if not spec.jitter:
            continue
        offset = dt.timedelta(milliseconds=int(jobs.get(spec.code, {}).get("jitter_ms", -1)))
        if not dt.timedelta(0) <= offset < dt.timedelta(seconds=spec.jitter):
            result.flag("JITTER_WRONG", None, f"{spec.code}: its offset {offset} is not in [0, {spec.jitter} s)")
            continue
        for row in by_job.get(spec.code, []):
            if row.trigger != "BEAT" or row.params_given:
                continue
            if row.due_at != row.slot + offset:
                result.flag("JITTER_WRONG", row, f"{spec.code} slot {row.slot:%H:%M:%S} due {row.due_at}, "
                            f"not its slot plus {offset}")
            first = row.claims()[0] if row.claims() else None
            if first and first.get("started") and first["started"] < row.slot + offset - dt.timedelta(seconds=0.5):
                result.flag("JITTER_EARLY", row, f"{spec.code} slot {row.slot:%H:%M:%S} started "
                            f"{first['started']:%H:%M:%S.%f}, before its offset {offset}")


def _window(by_job: dict[str, list[Row]], window: tuple[float, float], result: Result) -> None:
    opens, closes = (dt.datetime.fromtimestamp(value, dt.UTC) for value in window)
    for spec in specs.SPECS:
        if not spec.windowed:
            continue
        inside = 0
        for row in by_job.get(spec.code, []):
            if not opens <= row.slot < closes:
                result.flag("OUTSIDE_WINDOW", row, f"{spec.code} slot {row.slot:%H:%M:%S} ({row.status}) is outside "
                            f"its window {opens:%H:%M:%S} .. {closes:%H:%M:%S}")
            else:
                inside += 1
        result.notes[f"slots of the windowed job {spec.code} inside its window"] += inside
        if not inside and window[1] > window[0]:
            result.flag("WINDOW_UNTESTED", None, f"{spec.code} has no slot inside its window "
                        f"{opens:%H:%M:%S} .. {closes:%H:%M:%S}: the beats started after it closed, or never ran it")


def _params(by_job: dict[str, list[Row]], starts: Lines, person: Person,
            result: Result) -> None:
    for spec in specs.SPECS:
        if not spec.params:
            continue
        for row in by_job.get(spec.code, []):
            values = {**DEFAULTS, **row.params}
            if values.get("region") not in specs.REGIONS or type(values.get("n")) is not int:
                result.flag("BAD_PARAMS", row, f"{spec.code} recorded values it does not take: {row.params}")
            for attempt in row.claims():
                line = starts.get((row.id, attempt["fence"]))
                if line is not None and {**DEFAULTS, **line.get("params", {})} != values:
                    result.flag("PARAMS_MISMATCH", row, f"the body under fence {attempt['fence']} got "
                                f"{line.get('params')}, its row holds {row.params}")
            if row.scheduled:
                allowed = [{**DEFAULTS, **kwargs} for kwargs in person.kwargs_in_effect(row.created_at.timestamp())]
                if values not in allowed:
                    result.flag("PARAMS_NOT_IN_EFFECT", row, f"{spec.code} slot {row.slot:%H:%M:%S} recorded "
                                f"{row.created_at:%H:%M:%S.%f} with {row.params}; the kwargs in effect: {allowed}")


def _person(rows: list[Row], starts: Lines, person: Person,
            result: Result) -> None:
    by_id = {row.id: row for row in rows}
    ran = {execution for execution, _ in starts}
    cancelled, maybe = person.cancelled(), person.maybe_cancelled()
    for line in person.of("one-off"):
        row = by_id.get(line["exec"])
        if row is None or row.trigger != "ONE_OFF" or row.slot.timestamp() != line["at"]:
            result.flag("ONE_OFF_WRONG", line["exec"], f"the one-off recorded for {line['at']} is "
                        f"{(row.trigger, row.slot) if row else 'gone'}")
            continue
        if line["exec"] in maybe - cancelled:  # either outcome is right; it ran at most once (below)
            continue
        if line["exec"] in cancelled:
            if (row.status, row.skip_reason) != ("SKIPPED", "CANCELLED") or row.id in ran:
                result.flag("CANCELLED_RAN", row, f"a cancelled one-off ended {row.status} {row.skip_reason}"
                            f"{' and its body ran' if row.id in ran else ''}")
            continue
        if row.status == "SKIPPED" and row.skip_reason == "CANCELLED":
            result.flag("BAD_SKIP", row, "a one-off nobody cancelled was cancelled")
        first = row.claims()[0] if row.claims() else None
        if first and first.get("started") and first["started"].timestamp() < line["at"] - 0.5:
            result.flag("ONE_OFF_EARLY", row, f"the one-off for {row.slot:%H:%M:%S} started "
                        f"{first['started']:%H:%M:%S.%f}")
        _given(row, line.get("given"), result)
    instants: dict[tuple[str, dt.datetime], list[int]] = defaultdict(list)
    for row in rows:  # a cancelled one leaves its instant free for another (the 60-minute run had five)
        if row.trigger == "ONE_OFF" and not (row.status == "SKIPPED" and row.skip_reason == "CANCELLED"):
            instants[(row.job, row.slot)].append(row.id)
    for (code, slot), ids in instants.items():
        if len(ids) > 1:
            result.flag("ONE_OFF_TWICE", ids[-1], f"{code}'s one-off at {slot:%H:%M:%S} has {len(ids)} "
                        f"executions: {ids}")
    for line in person.of("run"):
        row = by_id.get(line["exec"])
        if row is None or row.trigger != "ENQUEUE" or row.params_given != bool(line.get("given")):
            found = (row.trigger, row.params_given) if row else "gone"
            result.flag("RUN_WRONG", line["exec"], f"the person's run is {found}")
            continue
        _given(row, line.get("given"), result)
    result.notes["one-off runs the person recorded (cancelled)"] += len(person.of("one-off"))
    result.notes["one-off runs the person cancelled in time"] += len(cancelled)
    result.notes["runs the person sent (with values or not)"] += len(person.of("run"))


def _given(row: Row, given: dict[str, Any] | None, result: Result) -> None:
    if given and any(row.params.get(name) != value for name, value in given.items()):
        result.flag("PARAMS_NOT_GIVEN", row, f"the person gave {given}, the row holds {row.params}")


def _tracked(rows: list[Row], lines: list[dict[str, Any]], result: Result) -> None:
    tracked = {row.id: row for row in rows if row.spec.tracked}
    ended: dict[int, int] = defaultdict(int)
    started: set[int] = set()
    for line in lines:
        execution = line.get("exec")
        if execution is None:
            result.flag("UNTRACKED_RUN", None, f"the tracked task ran without a claim's headers at {line['t']}")
            continue
        if int(execution) not in tracked:
            result.flag("UNRECORDED_RUN", int(execution), "the tracked task ran for an execution it has no row of")
            continue
        if line["ev"] == "end":
            ended[int(execution)] += 1
        else:
            started.add(int(execution))
    for row in tracked.values():
        if row.status == "SUCCEEDED" and not ended[row.id]:
            result.flag("UNBACKED_OUTCOME", row, "the tracked task's run is SUCCEEDED but its body never ended")
        elif row.status in ("FAILED", "TIMED_OUT"):
            result.flag("UNEXPECTED_FAILURE", row, f"the tracked task {row.status} {row.error_code}: "
                        f"{row.message[:200]}")
        elif row.status in ("SKIPPED", "MISSED") and row.id in started:
            result.flag("RAN_UNCLAIMED", row, f"the tracked task's body ran for a slot recorded {row.status}")
        elif row.status in OPEN:
            continue
    result.notes["tracked task's slots whose body ended more than once (a fenced duplicate)"] += sum(
        1 for count in ended.values() if count > 1)


def _paused(by_job: dict[str, list[Row]], person: Person, result: Result) -> None:
    for code in {line["job"] for line in [*person.of("pause"), *person.of("self-paused")]}:
        for row in by_job.get(code, []):
            moment = row.created_at.timestamp()
            if row.trigger in ("BEAT", "CATCH_UP") and any(
                    start + EDIT_LAG <= moment <= end for start, end in person.pauses(code, certain=True)):
                result.flag("DISPATCHED_WHILE_PAUSED", row, f"{code} slot {row.slot:%H:%M:%S} recorded "
                            f"{row.created_at:%H:%M:%S.%f} while it was paused")


def _told(rows: list[Row], by_job: dict[str, list[Row]], starts: Lines, result: Result) -> None:
    """What each body was told of the job's history is what its claim saw: the newest execution before
    it that had ended (``previous``; ``last_success``: that had succeeded), and none when none had."""
    by_id = {row.id: row for row in rows}
    slack = dt.timedelta(seconds=SEEN_SLACK)
    for (execution_id, fence), line in starts.items():
        row = by_id.get(execution_id)
        claim = next((a for a in row.claims() if a.get("fence") == fence), None) if row is not None else None
        if row is None or claim is None or claim.get("started") is None or "previous" not in line:
            continue
        claimed_at = claim["started"]
        before = [other for other in by_job[row.job] if (other.slot, other.run_number) < (row.slot, row.run_number)]
        for key, statuses in (("previous", RAN), ("last_success", ("SUCCEEDED",))):
            # A run that never started (its message could not be sent, or never reached a worker) did not run.
            ended = [other for other in before if other.status in statuses and other.ended is not None
                     and other.started is not None]
            surely = max((o for o in ended if o.ended <= claimed_at - slack),  # type: ignore[operator]
                         key=_order, default=None)
            told = by_id.get(line[key]) if line[key] is not None else None
            what = "succeeded" if len(statuses) == 1 else "ended"
            if line[key] is not None and (told is None or told not in ended
                                          or told.ended > claimed_at + slack):  # type: ignore[operator]
                result.flag("HISTORY_WRONG", row, f"{key} under fence {fence}: execution {line[key]} is not an "
                            f"earlier execution of {row.job} that had {what} by its claim at {claimed_at:%H:%M:%S.%f}")
            elif surely is not None and (told is None or _order(told) < _order(surely)):
                result.flag("HISTORY_WRONG", row, f"{key} under fence {fence}: told {line[key]}, but execution "
                            f"{surely.id} (slot {surely.slot:%H:%M:%S}) came later and had ended at "
                            f"{surely.ended:%H:%M:%S.%f}, before its claim at {claimed_at:%H:%M:%S.%f}")


def _order(row: Row) -> tuple[dt.datetime, int]:
    return row.slot, row.run_number
