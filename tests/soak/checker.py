"""The soak's checker: the whole history, from the rows and from the marker files the bodies wrote.

Rows are not trusted alone: every recorded outcome of a body must be backed by the body's own
end line with the same fence, every body must have run under a claim the history knows, and the
exclusive jobs' bodies must never overlap. What the product may legitimately record under faults
(SKIPPED, MISSED, LOST, TIMED_OUT...) is accepted only in the cases docs/concepts.md and
docs/reliability.md describe.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.soak import feature_checks, pause_checks
from tests.soak import spec as specs
from tests.soak.history import (
    BODY_STATUSES,
    DISPATCH_MISSED,
    FAILURES,
    OPEN,
    TAKEN_OVER,
    Result,
    Row,
    read_lines,
)


def check(rows: list[Row], alerts: list[tuple[Any, ...]], markers: Path, *,
          republish_limit: int, lost_outcome_logs: set[int], faults: list[tuple[str, float, float]],
          lease: float, jobs: dict[str, dict[str, Any]] | None = None,
          window: tuple[float, float] = (0.0, 0.0), pause_ends: list[tuple[str, float]] | None = None) -> Result:
    """``jobs``: each job row's code to its columns the feature checks read (``jitter_ms``);
    ``window``: the windowed job's, epoch seconds; ``pause_ends``: the pauses that ended by themselves
    (``history.load_pause_ends``)."""
    result = Result()
    bodies = read_lines(markers, "bodies")
    delivered = read_lines(markers, "alerts")
    person = feature_checks.Person.read(markers)
    person.pause_ends = pause_ends or []
    result.bodies = sum(1 for line in bodies if line["ev"] == "start")
    starts: dict[tuple[int, int], dict[str, Any]] = {}
    ends: dict[tuple[int, int], dict[str, Any]] = {}
    for line in bodies:
        (starts if line["ev"] == "start" else ends)[(line["exec"], line["fence"])] = line
    by_id = {row.id: row for row in rows}
    for row in rows:
        result.statuses[row.status] += 1
    _slots(rows, result, person)
    for row in rows:
        _row(row, result, starts, ends, republish_limit, by_id, rows, lost_outcome_logs, person)
    _bodies(rows, by_id, starts, ends, result)
    _overlaps(rows, starts, ends, result)
    _alerts(rows, alerts, delivered, result, person.lines)
    pause_checks.check(person.lines, pause_ends or [], result)
    _lost_notes(rows, faults, lease, result)
    feature_checks.check_all(rows, starts, ends, read_lines(markers, "tracked"), person, result,
                             jobs=jobs or {}, window=window)
    return result


def _by_job(rows: list[Row]) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[row.job].append(row)
    return grouped


def _slots(rows: list[Row], result: Result, person: feature_checks.Person) -> None:
    """One scheduled execution per due slot, on the schedule's grid, without holes (but for the
    slots of a pause the person made)."""
    for code, job_rows in _by_job(rows).items():
        spec = specs.spec_of(code)
        if spec is None:
            result.flag("UNKNOWN_JOB", None, f"rows of job {code}, which the soak does not declare")
            continue
        per_slot: dict[dt.datetime, list[Row]] = defaultdict(list)
        for row in job_rows:
            if row.scheduled:
                per_slot[row.slot].append(row)
        result.slots += len(per_slot)
        for slot, same in per_slot.items():
            if len(same) > 1 or same[0].run_number != 1:
                result.flag("DUPLICATE_EXECUTION", same[-1], f"{code} slot {slot:%H:%M:%S} has executions "
                            f"{[(r.id, r.run_number, r.status) for r in same]}")
            if sum(1 for r in same if r.status == "SUCCEEDED") > 1:
                result.flag("TWO_SUCCEEDED", same[-1], f"{code} slot {slot:%H:%M:%S} succeeded twice")
            if slot.timestamp() % spec.every and not spec.tracked:  # an interval's slots count from its start
                result.flag("OFF_GRID_SLOT", same[0], f"{code} slot {slot:%H:%M:%S} is not on its {spec.every} s grid")
        ordered = sorted(per_slot)
        for before, after in itertools.pairwise(ordered):
            if spec.tracked and (after - before).total_seconds() < spec.every:
                result.flag("OFF_GRID_SLOT", per_slot[after][0], f"{code}: slots {before:%H:%M:%S.%f} and "
                            f"{after:%H:%M:%S.%f} are closer than its {spec.every} s interval")
            if (after - before).total_seconds() > spec.every and not person.paused_between(
                    code, before.timestamp(), after.timestamp()):
                result.flag("SLOT_GAP", per_slot[after][0], f"{code}: no execution between {before:%H:%M:%S} "
                            f"and {after:%H:%M:%S}")


def _row(row: Row, result: Result, starts: dict[tuple[int, int], dict[str, Any]],
         ends: dict[tuple[int, int], dict[str, Any]], republish_limit: int, by_id: dict[int, Row],
         rows: list[Row], lost_outcome_logs: set[int], person: feature_checks.Person) -> None:
    spec = row.spec
    status = row.status
    if status in OPEN:
        result.flag("OPEN_EXECUTION", row, f"{row.job} slot {row.slot:%H:%M:%S} left {status}")
        return
    if row.retry_count > spec.max_retries:
        result.flag("TOO_MANY_ATTEMPTS", row, f"retry_count {row.retry_count} > max_retries {spec.max_retries}")
    if row.republished > republish_limit:  # every send again counts, whatever the broker answered
        result.flag("TOO_MANY_SENDS", row, f"sent again {row.republished} times > REPUBLISH_LIMIT {republish_limit}")
    if feature_checks.decided_elsewhere(row, person):
        return  # a skip for a feature's reason, or a tracked task's run: feature_checks judges it
    if status == "FAILED" and row.error_code == "PUBLISH_FAILED" and row.trigger == "ENQUEUE":
        return  # the person's run, sent while the broker was down: refused at once, recorded so
    if status in BODY_STATUSES:
        end = ends.get((row.id, row.fence or -1))
        start = starts.get((row.id, row.fence or -1))
        if status == "TIMED_OUT":
            # The soft limit may land anywhere in the body (even after its end line), the hard
            # limit kills it: the body must have started under this fence.
            if start is None:
                result.flag("UNBACKED_OUTCOME", row, f"TIMED_OUT under fence {row.fence} but no body started under it")
        elif end is None:
            result.flag("UNBACKED_OUTCOME", row, f"{status} under fence {row.fence} but no body ended under it")
        elif specs.OUTCOME_STATUS.get(end["outcome"]) != status:
            result.flag("OUTCOME_MISMATCH", row, f"recorded {status}, the body under fence {row.fence} "
                        f"ended {end['outcome']!r}")
        if status == "SUCCEEDED" and f"fence={row.fence}" not in row.message:
            result.flag("FENCED_WRITE", row, f"SUCCEEDED with fence {row.fence} but the message {row.message!r} "
                        "was written by another claim")
        if status == "FAILED" and row.error_code in ("DesignedFailure", "DESIGNED") and \
                f"fence={row.fence}" not in row.message:
            result.flag("FENCED_WRITE", row, f"FAILED with fence {row.fence} but the message {row.message!r} "
                        "was written by another claim")
        if status == "FAILED" and row.error_code not in ("DesignedFailure", "DESIGNED", "LEASE_LOST", "INTERRUPTED"):
            result.flag("UNEXPECTED_FAILURE", row, f"FAILED {row.error_code}: {row.message[:200]}")
        retried_kind = status == "TIMED_OUT" or row.error_code in ("DesignedFailure", "LEASE_LOST", "INTERRUPTED")
        if retried_kind and row.retry_count < spec.max_retries:
            result.flag("NOT_RETRIED", row, f"final {status} ({row.error_code}) after {row.retry_count + 1} attempts "
                        f"of {spec.max_retries + 1}")
        return
    if status == "LOST":
        if row.error_code == "NOT_DELIVERED":
            if row.republished < republish_limit:
                result.flag("LOST_EARLY", row, f"LOST NOT_DELIVERED after {row.republished} sends "
                            f"(REPUBLISH_LIMIT {republish_limit})")
            return
        if row.error_code not in ("WORKER_LOST", "LEASE_EXPIRED"):
            result.flag("UNEXPECTED_LOST", row, f"LOST {row.error_code}: {row.message[:200]}")
        if row.retry_count < spec.max_retries:
            result.flag("NOT_RETRIED", row,
                        f"final LOST after {row.retry_count + 1} attempts of {spec.max_retries + 1}")
        last = row.claims()[-1] if row.claims() else None
        if last is not None and (row.id, last["fence"]) in ends and row.id in lost_outcome_logs:
            result.flag("FINAL_WRITE_LOST", row, f"the body under fence {last['fence']} ended "
                        f"{ends[(row.id, last['fence'])]['outcome']!r}, its worker could not write the outcome "
                        "(database error), and the reconciler recorded it LOST")
        return
    if status == "SKIPPED":
        if row.skip_reason in ("ALREADY_RAN", "ALREADY_RUNNING"):
            # The slot check: another execution of the job has this slot (the person's run and a one-off
            # of one instant, both without values given), recorded before this one was decided, and it
            # ran or was on its way then (one that ended without starting, unsent or undelivered, never ran).
            decided = row.ended or row.created_at
            if not any(other.id != row.id and other.job == row.job and other.slot == row.slot
                       and other.created_at <= decided
                       and not (other.started is None and other.ended is not None and other.ended <= decided)
                       for other in rows):
                result.flag("BAD_SKIP", row, f"SKIPPED {row.skip_reason} although no other execution of "
                            f"{row.job} has its slot {row.slot:%H:%M:%S}")
            else:
                result.notes["runs skipped by the slot check beside another execution of their slot "
                             "(the person's run and one-off of one instant)"] += 1
            return
        if row.skip_reason not in ("OVERLAP", "LOCK_UNAVAILABLE"):
            result.flag("BAD_SKIP", row, f"SKIPPED {row.skip_reason}")
            return
        if not spec.exclusive:
            result.flag("BAD_SKIP", row, f"SKIPPED {row.skip_reason} although {row.job} allows overlap")
        if row.trigger != "BEAT" and spec.pattern != "rate_limited":
            result.flag("BAD_SKIP", row, f"a {row.trigger} execution SKIPPED {row.skip_reason}: it should have waited")
        # Under catch-up "all" a slot sent late (after an outage, or sent again by the reconciler) is a
        # catch-up that waits for the live run: only a slot sent on time may be skipped by it. (The
        # margin: a beat that planned on time may write its row after a database stall of some seconds.)
        late_by = dt.timedelta(seconds=min(60, max(1, spec.every // 2)) + 30)
        if spec.catch_up == "all" and row.trigger == "BEAT" and spec.pattern != "rate_limited" and (
                row.republished > 0 or row.created_at > row.slot + late_by):
            result.flag("BAD_SKIP", row, f"a late BEAT slot {row.slot:%H:%M:%S} (recorded "
                        f"{row.created_at:%H:%M:%S.%f}, sent again {row.republished} times) SKIPPED "
                        f"{row.skip_reason} under catch-up 'all': it should have waited as a catch-up")
        moment = row.ended  # the skip's transaction start: the run it met may have been claimed while it waited
        live = moment is not None and any(
            other.id != row.id and other.job == row.job and other.started is not None
            and other.started <= moment + dt.timedelta(seconds=5)
            and (other.ended is None or other.ended >= moment) for other in rows)
        # Or older runs of the job waited for its room then (they go first: docs/concepts.md, overlap):
        # recorded before the skip, not started nor ended by then.
        behind = moment is not None and any(
            other.id != row.id and other.job == row.job and other.slot < row.slot and other.created_at <= moment
            and (other.started is None or other.started >= moment - dt.timedelta(seconds=1))
            and (other.ended is None or other.ended >= moment) for other in rows)
        if not live and not behind:
            result.flag("SKIP_WITHOUT_LIVE_RUN", row, f"SKIPPED {row.skip_reason} at {moment} while no other "
                        f"execution of {row.job} was running or waiting before it")
        if spec.overlap == "buffer_one" and row.trigger == "BEAT" and not _buffer_held(row, rows, moment):
            result.flag("BUFFER_NOT_KEPT", row, f"a regular slot of {row.job} (overlap buffer_one) SKIPPED "
                        f"{row.skip_reason} at {moment} while no other regular slot of it waited: it should have")
        return
    if status == "MISSED":
        if spec.catch_up == "all":
            result.flag("BAD_MISSED", row, f"MISSED ({row.error_code or 'not dispatched'}) under catch-up 'all'")
            return
        if row.error_code == "NOT_DELIVERED":
            newer = any(other.job == row.job and other.slot > row.slot and other.trigger in ("BEAT", "CATCH_UP")
                        for other in rows)
            if spec.catch_up == "latest" and not newer:
                result.flag("BAD_MISSED", row, "MISSED NOT_DELIVERED under 'latest' with no newer slot dispatched")
            if row.trigger not in ("BEAT", "CATCH_UP"):
                result.flag("BAD_MISSED", row, f"MISSED NOT_DELIVERED of a {row.trigger} execution")
            return
        if row.message != DISPATCH_MISSED:
            result.flag("BAD_MISSED", row, f"MISSED {row.error_code}: {row.message[:200]}")
            return
        late = dt.timedelta(seconds=spec.every if spec.catch_up == "latest" else min(60, max(1, spec.every // 2)))
        if row.created_at < row.slot + late - dt.timedelta(seconds=0.5):
            result.flag("MISSED_EARLY", row, f"recorded MISSED at {row.created_at:%H:%M:%S.%f}, before the slot "
                        f"{row.slot:%H:%M:%S} was overdue ({late.total_seconds():g} s)")
        return
    result.flag("UNEXPECTED_STATUS", row, f"{status} {row.error_code}: {row.message[:200]}")


def _bodies(rows: list[Row], by_id: dict[int, Row], starts: dict[tuple[int, int], dict[str, Any]],
            ends: dict[tuple[int, int], dict[str, Any]], result: Result) -> None:
    """Every body ran under a claim its execution's history records, and what it did is what was
    recorded for that attempt (or the attempt was taken over, killed, or lost)."""
    done: Counter[tuple[str, int]] = Counter()
    for (execution_id, fence), line in starts.items():
        row = by_id.get(execution_id)
        claims = {attempt["fence"]: attempt for attempt in row.claims()} if row is not None else {}
        if fence not in claims:
            result.flag("UNRECORDED_RUN", execution_id, f"a body ran under fence {fence}, which the execution's "
                        "history does not record")
            continue
        if line["attempt"] != claims[fence].get("attempt", line["attempt"]):
            result.flag("ATTEMPT_MISMATCH", execution_id, f"the body under fence {fence} was told attempt "
                        f"{line['attempt']}, the history says {claims[fence].get('attempt')}")
        end = ends.get((execution_id, fence))
        if end is None:
            continue
        recorded = claims[fence].get("status")
        if end["outcome"] == "ok":
            done[(line["job"], line["slot"])] += 1
        if recorded in ("SUCCEEDED", "FAILED") and specs.OUTCOME_STATUS.get(end["outcome"]) != recorded:
            result.flag("OUTCOME_MISMATCH", execution_id, f"attempt under fence {fence} recorded {recorded}, "
                        f"its body ended {end['outcome']!r}")
    for (execution_id, fence) in ends:
        if (execution_id, fence) not in starts:
            result.flag("UNRECORDED_RUN", execution_id, f"a body ended under fence {fence} without a start line")
    result.notes["slots whose body completed 'ok' more than once (a fenced duplicate finished too)"] += sum(
        1 for count in done.values() if count > 1)


def _buffer_held(row: Row, rows: list[Row], moment: dt.datetime | None) -> bool:
    """Whether another regular slot of the job waited for it when ``row`` was skipped (overlap buffer_one
    keeps one): recorded by then, not started (a second of slack) nor ended by then."""
    return moment is not None and any(
        other.id != row.id and other.job == row.job and other.trigger == "BEAT" and other.created_at <= moment
        and (other.started is None or other.started >= moment - dt.timedelta(seconds=1))
        and (other.ended is None or other.ended >= moment) for other in rows)


def _overlaps(rows: list[Row], starts: dict[tuple[int, int], dict[str, Any]],
              ends: dict[tuple[int, int], dict[str, Any]], result: Result) -> None:
    """Exclusive jobs: attempts recorded by their bodies never overlap, by the rows' [started, ended]
    (database clock) and by the bodies' own start and end lines (each process's clock)."""
    for code, job_rows in _by_job(rows).items():
        spec = specs.spec_of(code)
        if spec is None or not spec.exclusive:
            continue
        recorded, bodies = feature_checks.attempt_spans(job_rows, starts, ends, {code})
        for kind, spans in (("OVERLAP_ROWS", recorded), ("OVERLAP_BODIES", bodies)):
            spans.sort()
            reach: tuple[float, float, int] | None = None  # the span reaching furthest so far
            for b_start, b_end, b_id in spans:
                if reach is None or b_end > reach[1]:
                    previous, reach = reach, (b_start, b_end, b_id)
                else:
                    previous = reach
                if previous is None:
                    continue
                _, a_end, a_id = previous
                if b_start < a_end:
                    # A run frozen (or cut from the database) past its lease lets the job's next
                    # run start, but its own outcome is then fenced: it never appears here.
                    result.flag(kind, b_id, f"{code}: runs of executions {a_id} and {b_id} overlap by "
                                f"{a_end - b_start:.3f} s")


def _alerts(rows: list[Row], alerts: list[tuple[Any, ...]], delivered: list[dict[str, Any]],
            result: Result, person: list[dict[str, Any]] | None = None) -> None:
    """Once per incident: walk each job's final outcomes in the order they were written."""
    result.alerts = len(alerts)
    actual: Counter[tuple[int, str]] = Counter((execution_id, event) for _, execution_id, _, event, _, _ in alerts)
    expected: Counter[tuple[int, str]] = Counter()
    optional: set[tuple[int, str]] = set()
    by_id = {row.id: row for row in rows}
    for code, job_rows in _by_job(rows).items():
        spec = specs.spec_of(code)
        if spec is None:
            continue
        in_a_row, alerted = 0, False
        # A run that could not be sent (PUBLISH_FAILED: its sender was told at once) never ran: it
        # neither counts as a failure nor ends an incident.
        finals = sorted((row for row in job_rows if row.status in (*FAILURES, "SUCCEEDED") and row.ended
                         and row.error_code != "PUBLISH_FAILED"), key=lambda row: (row.ended, row.id))
        for row in finals:
            if row.status == "SUCCEEDED":
                if alerted:
                    expected[(row.id, "RECOVERED")] += 1
                in_a_row, alerted = 0, False
                continue
            in_a_row += 1
            if not alerted and in_a_row >= spec.alert_after:
                expected[(row.id, row.status)] += 1
                alerted = True
        paused, maybe = pause_checks.paused_alerts(spec, finals, person or [])
        expected.update(paused)
        optional |= maybe
        for row in job_rows:  # a worker that died alerts LOST at once, once per execution
            history = row.attempts[:-1] if row.status not in OPEN else row.attempts
            if any(a.get("status") == "LOST" and a.get("error_code") in ("WORKER_LOST", "LEASE_EXPIRED")
                   and a.get("message") != TAKEN_OVER for a in history) and expected[(row.id, "LOST")] == 0:
                expected[(row.id, "LOST")] += 1
        for row in job_rows:
            if row.status == "MISSED":
                optional.add((row.id, "MISSED"))
        _missed_alerts(code, job_rows, [alert for alert in alerts if alert[2] == code and alert[3] == "MISSED"],
                       result)
    for key, count in expected.items():
        if actual[key] < count:
            found = by_id.get(key[0])
            result.flag("ALERT_MISSING", key[0], f"no {key[1]} alert (final {found.status if found else '?'}, "
                        f"{found.error_code if found else ''})")
    for key, count in actual.items():
        if count > 1 and key[1] != "MISSED":
            result.flag("ALERT_TWICE", key[0], f"{count} {key[1]} alerts on one channel")
        elif key not in expected and key not in optional:
            found = by_id.get(key[0])
            result.flag("ALERT_EXTRA", key[0], f"a {key[1]} alert the policy does not call for (final "
                        f"{found.status if found else '?'})")
    received = Counter((line["execution"], line["event"]) for line in delivered)
    for alert_id, execution_id, _code, event, status, _ in alerts:
        if status != "SENT":
            result.flag("ALERT_UNDELIVERED", execution_id, f"alert {alert_id} ({event}) left {status}")
        elif not received[(execution_id, event)]:
            result.flag("ALERT_NOT_RECEIVED", execution_id, f"alert {alert_id} ({event}) is SENT but the channel "
                        "never received it")
    result.notes["alerts delivered more than once (at least once is the promise)"] += sum(
        1 for count in received.values() if count > 1)


def _missed_alerts(code: str, job_rows: list[Row], missed_alerts: list[tuple[Any, ...]], result: Result) -> None:
    """MISSED slots alert once per job and outage (docs/notifications.md). The product's rule,
    replayed: when a slot is recorded MISSED, it alerts unless a MISSED slot later than the job's
    newest slot that had started by then already alerted. A start or an alert within a second of
    the recording may fall either side of it: then either answer is accepted."""
    starts = sorted((row.started.timestamp(), row.slot) for row in job_rows if row.started is not None)
    by_id = {row.id: row for row in job_rows}
    alerted_at = {alert[1]: alert[5].timestamp() for alert in missed_alerts if alert[1] in by_id}
    slack = 1.0

    def recorded(row: Row) -> float:
        return (row.ended or row.created_at).timestamp()

    def alerts(moment: float, group: set[int]) -> bool:
        """Whether a slot recorded MISSED at ``moment`` alerts (alerts of its own group aside)."""
        floor = max((slot for at, slot in starts if at <= moment), default=None)
        return not any(other not in group and at < moment and (floor is None or by_id[other].slot > floor)
                       for other, at in alerted_at.items())

    # Slots recorded MISSED in one statement (one beat tick, one reconciler step) form one group:
    # the first of them the product records alerts, the others see its alert.
    groups: dict[float, list[Row]] = defaultdict(list)
    for row in job_rows:
        if row.status == "MISSED":
            groups[recorded(row)].append(row)
    events = sorted([at for at, _ in starts] + list(alerted_at.values()))
    for moment, group in sorted(groups.items()):
        others = {row.id for row in group}
        # The product decides at some instant within the slack of the recorded moment: every instant
        # just after a start or an alert inside it is a view it may have had (the start of a newer slot
        # and another slot's alert may fall either side of it, independently).
        views = [moment - slack, moment, moment + slack,
                 *(at + 1e-6 for at in events if moment - slack <= at <= moment + slack)]
        allowed = {alerts(view, others) for view in views}
        sent = [row for row in group if row.id in alerted_at]
        slots = ", ".join(f"{row.slot:%H:%M:%S}" for row in group)
        if len(sent) > 1 or (sent and allowed == {False}):
            result.flag("ALERT_TWICE", sent[-1], f"{code}: MISSED slots {slots} alerted although their outage "
                        "had alerted already")
        elif not sent and allowed == {True}:
            result.flag("ALERT_MISSING", group[0], f"{code}: slots {slots} recorded MISSED "
                        f"({group[0].error_code or 'not dispatched'}), and their outage alerted nobody")


def _lost_notes(rows: list[Row], faults: list[tuple[str, float, float]], lease: float, result: Result) -> None:
    """Lost attempts with no fault near them: the machine was too slow to renew a lease (noted)."""
    for row in rows:
        for attempt in row.claims():
            if attempt.get("status") != "LOST" or not attempt.get("started"):
                continue
            begin = attempt["started"].timestamp()
            end = (attempt.get("ended") or attempt["started"]).timestamp()
            near = any(start <= end + 1 and stop + lease + 5 >= begin for _, start, stop in faults)
            result.notes["lost attempts" if near else "lost attempts with no fault near them (a slow machine)"] += 1


FINAL_WRITE_LOG = re.compile(r"could not record the outcome of execution (\d+)")


def outcome_write_failures(logs: Path) -> set[int]:
    """Executions whose worker logged that it could not write the outcome (a database error)."""
    found: set[int] = set()
    for path in logs.glob("worker-*.log"):
        found.update(int(match) for match in FINAL_WRITE_LOG.findall(path.read_text(errors="replace")))
    return found
