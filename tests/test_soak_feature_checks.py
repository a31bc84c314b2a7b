"""The soak checker's rules for the newer features can fail: each is fed a small history that
breaks it (and the same history kept, which passes). Pure logic: rows and lines as the soak
reads them, no database."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

from tests.soak import checker, feature_checks
from tests.soak.history import Result, Row

T0 = dt.datetime(2026, 12, 7, 8, 0, 0, tzinfo=dt.UTC)


def row(ident: int, job: str, slot: float, status: str = "SUCCEEDED", *, trigger: str = "BEAT",
        skip_reason: str = "", started: float | None = None, ended: float | None = None,
        **extra: Any) -> Row:
    at = T0 + dt.timedelta(seconds=slot)
    begin = T0 + dt.timedelta(seconds=started if started is not None else slot)
    end = T0 + dt.timedelta(seconds=ended if ended is not None else slot + 0.5)
    body = status in ("SUCCEEDED", "FAILED", "TIMED_OUT")
    return Row(id=ident, job=job, slot=at, run_number=1, status=status, trigger=trigger, skip_reason=skip_reason,
               created_at=at, started=begin if body else None, ended=end, fence=ident if body else None,
               retry_count=0, attempts=[], error_code="", message=f"ok fence={ident}", republished=0, **extra)


def run_checks(rows: list[Row], person: list[dict[str, Any]] | None = None,
               jobs: dict[str, dict[str, Any]] | None = None, *, window: tuple[float, float] = (0.0, 0.0),
               tracked: list[dict[str, Any]] | None = None,
               starts: dict[tuple[int, int], dict[str, Any]] | None = None) -> dict[str, list[str]]:
    result = Result()
    feature_checks.check_all(rows, starts or {}, {}, tracked or [], feature_checks.Person(person or []), result,
                             jobs=jobs or {"S12": {"jitter_ms": 1500}}, window=window)
    return {kind: found for kind, found in result.anomalies.items() if found}


def test_a_fan_in_that_runs_although_an_upstream_failed_or_leaves_a_slot_undecided_is_reported() -> None:
    kept = [row(1, "S01", 0), row(2, "S04", 0), row(3, "S09", 0, trigger="UPSTREAM"),
            row(4, "S01", 2), row(5, "S04", 2, "FAILED"), row(6, "S09", 2, "SKIPPED", trigger="UPSTREAM",
                                                                skip_reason="UPSTREAM")]
    assert "FAN_IN_WRONG" not in run_checks(kept) and "UNDECIDED_DOWNSTREAM" not in run_checks(kept)
    ran = [*kept[:5], row(6, "S09", 2, trigger="UPSTREAM")]
    assert "FAN_IN_WRONG" in run_checks(ran)
    assert "UNDECIDED_DOWNSTREAM" in run_checks(kept[:5])


def test_three_live_runs_of_a_group_of_two_are_reported() -> None:
    two = [row(1, "S10", 0, started=0, ended=3), row(2, "S11", 0, started=1, ended=2)]
    assert not {"GROUP_EXCEEDED_ROWS"} & set(run_checks(two))
    three = [*two, row(3, "S10", 1, started=1.5, ended=2.5)]
    assert "GROUP_EXCEEDED_ROWS" in run_checks(three)


def test_a_concurrency_skip_with_the_group_idle_and_a_cancel_nobody_made_are_reported() -> None:
    idle = [row(1, "S11", 10, "SKIPPED", skip_reason="CONCURRENCY")]
    assert "SKIP_WITHOUT_LIVE_RUN" in run_checks(idle)
    room = [*idle, row(2, "S10", 9, started=9, ended=12)]  # one of its two places taken
    assert "SKIP_WITHOUT_LIVE_RUN" in run_checks(room)
    busy = [*room, row(4, "S11", 8, started=8, ended=11)]
    assert "SKIP_WITHOUT_LIVE_RUN" not in run_checks(busy)
    cancelled = [row(3, "S14", 11, "SKIPPED", trigger="ONE_OFF", skip_reason="CANCELLED")]
    assert "BAD_SKIP" in run_checks(cancelled)
    assert "BAD_SKIP" not in run_checks(cancelled, [{"ev": "cancelled", "exec": 3, "t": 0.0}])


def test_a_jittered_slot_started_before_its_offset_is_reported() -> None:
    on_time = row(1, "S12", 4, started=5.6, due_at=T0 + dt.timedelta(seconds=5.5))
    assert not run_checks([on_time])
    early = row(1, "S12", 4, started=4.2, due_at=T0 + dt.timedelta(seconds=5.5))
    assert "JITTER_EARLY" in run_checks([early])


def test_a_scheduled_run_given_values_no_edit_made_in_effect_is_reported() -> None:
    edits = [{"ev": "kwargs", "t": (T0 + dt.timedelta(seconds=10)).timestamp(), "good": True,
              "values": {"region": "us"}},
             {"ev": "kwargs", "t": (T0 + dt.timedelta(seconds=20)).timestamp(), "good": False, "values": None}]
    before = row(1, "S14", 6, params={})
    after = row(2, "S14", 15, params={"region": "us"})
    after_bad = row(3, "S14", 24, params={"region": "us"})
    assert not run_checks([before, after, after_bad], edits)
    stale = row(2, "S14", 15, params={})  # five seconds after the edit, still the old values
    assert "PARAMS_NOT_IN_EFFECT" in run_checks([before, stale, after_bad], edits)
    refused_taken = row(3, "S14", 24, params={"region": "asia"})
    assert "BAD_PARAMS" in run_checks([before, after, refused_taken], edits)


def test_a_slot_recorded_while_its_job_was_paused_is_reported(tmp_path: Path) -> None:
    pause = [{"ev": "pause", "job": "S04", "t": (T0 + dt.timedelta(seconds=10)).timestamp()},
             {"ev": "resume", "job": "S04", "t": (T0 + dt.timedelta(seconds=20)).timestamp()}]
    assert "DISPATCHED_WHILE_PAUSED" not in run_checks([row(1, "S04", 8), row(2, "S04", 22)], pause)
    assert "DISPATCHED_WHILE_PAUSED" in run_checks([row(1, "S04", 8), row(2, "S04", 16)], pause)
    (tmp_path / "person.jsonl").write_text("".join(f'{{"ev": "{line["ev"]}", "job": "S04", "t": {line["t"]}}}\n'
                                                   for line in pause), encoding="utf-8")
    person = feature_checks.Person.read(tmp_path)
    assert person.paused_between("S04", (T0 + dt.timedelta(seconds=8)).timestamp(),
                                 (T0 + dt.timedelta(seconds=22)).timestamp())
    assert not person.paused_between("S01", (T0 + dt.timedelta(seconds=8)).timestamp(),
                                     (T0 + dt.timedelta(seconds=22)).timestamp())


def test_a_run_that_could_not_be_sent_neither_alerts_nor_ends_an_incident() -> None:
    """A person's run closed FAILED ``PUBLISH_FAILED`` (the broker was down; the sender was told)
    calls for no alert, and the success after it no RECOVERED; a failure that ran calls for both."""
    unsent = dataclasses.replace(row(1, "S14", 1, "FAILED", trigger="ENQUEUE"), error_code="PUBLISH_FAILED",
                                 started=None, fence=None)
    history = [unsent, row(2, "S14", 3)]
    result = Result()
    checker._alerts(history, [], [], result)
    assert not result.anomalies.get("ALERT_MISSING")
    ran = [row(1, "S14", 1, "FAILED", trigger="ENQUEUE"), row(2, "S14", 3)]
    checker._alerts(ran, [], [], result)
    assert len(result.anomalies["ALERT_MISSING"]) == 2, result.anomalies


def at(seconds: float) -> float:
    return (T0 + dt.timedelta(seconds=seconds)).timestamp()


def test_a_windowed_slot_outside_its_window_and_a_window_never_reached_are_reported() -> None:
    window = (at(10), at(20))
    assert not run_checks([row(1, "S13", 12), row(2, "S13", 19)], window=window)
    assert "OUTSIDE_WINDOW" in run_checks([row(1, "S13", 12), row(2, "S13", 20, "MISSED")], window=window)
    assert "WINDOW_UNTESTED" in run_checks([], window=window)


def test_a_jittered_slot_due_at_another_offset_is_reported() -> None:
    assert "JITTER_WRONG" in run_checks([row(1, "S12", 4, started=6.0, due_at=T0 + dt.timedelta(seconds=5.9))])


def test_the_persons_one_offs_cancelled_early_twice_and_runs_not_their_own_are_reported() -> None:
    one_off = [{"ev": "one-off", "exec": 1, "at": at(7), "given": {"region": "us"}}]
    kept = row(1, "S14", 7, trigger="ONE_OFF", params={"region": "us"}, params_given=True)
    assert not run_checks([kept], one_off)
    assert "ONE_OFF_EARLY" in run_checks([row(1, "S14", 7, trigger="ONE_OFF", started=5.0,
                                              params={"region": "us"})], one_off)
    assert "PARAMS_NOT_GIVEN" in run_checks([row(1, "S14", 7, trigger="ONE_OFF", params={"region": "eu"})], one_off)
    assert "ONE_OFF_TWICE" in run_checks([kept, row(2, "S14", 7, trigger="ONE_OFF", params={"region": "us"})],
                                         one_off)
    # Cancelled, then recorded again for the same instant (the person did so five times in 60 minutes).
    again = [{"ev": "one-off", "exec": 2, "at": at(7), "given": {"region": "us"}},
             {"ev": "cancelled", "exec": 2, "t": at(3)}, *one_off]
    cancelled_first = row(2, "S14", 7, "SKIPPED", trigger="ONE_OFF", skip_reason="CANCELLED")
    assert "ONE_OFF_TWICE" not in run_checks([cancelled_first, kept], again)
    cancel = [*one_off, {"ev": "cancelled", "exec": 1, "t": at(5)}]
    assert "CANCELLED_RAN" in run_checks([kept], cancel)
    maybe = [*one_off, {"ev": "cancel-failed", "exec": 1, "t": at(5)}]  # it may have committed: either is right
    skipped = row(1, "S14", 7, "SKIPPED", trigger="ONE_OFF", skip_reason="CANCELLED")
    assert not run_checks([kept], maybe) and not run_checks([skipped], maybe)
    run = [{"ev": "run", "exec": 3, "given": {"n": 4}, "slot": at(8)}]
    assert "RUN_WRONG" in run_checks([row(3, "S14", 8, trigger="BEAT", params={"n": 4})], run)


def test_a_paused_skip_is_judged_with_the_beats_lag_and_an_uncertain_pause_forbids_nothing() -> None:
    pause = [{"ev": "pause", "job": "S04", "t": at(10)}, {"ev": "resume", "job": "S04", "t": at(20)}]
    near = row(1, "S04", 10, "SKIPPED", skip_reason="PAUSED", ended=9.0)  # its transaction began as the pause saved
    assert "BAD_SKIP" not in run_checks([near], pause)
    assert "BAD_SKIP" in run_checks([row(1, "S04", 30, "SKIPPED", skip_reason="PAUSED", ended=30.0)], pause)
    uncertain = [pause[0], {"ev": "pause-failed", "job": "S04", "t": at(10.1)}, pause[1]]
    assert "DISPATCHED_WHILE_PAUSED" in run_checks([row(2, "S04", 16)], pause)
    assert "DISPATCHED_WHILE_PAUSED" not in run_checks([row(2, "S04", 16)], uncertain)


def test_a_tracked_tasks_run_without_headers_unbacked_or_for_a_skipped_slot_is_reported() -> None:
    done = row(1, "PT3", 2)
    lines = [{"ev": "start", "exec": 1, "t": at(2)}, {"ev": "end", "exec": 1, "t": at(2.5)}]
    assert not run_checks([done], tracked=lines)
    assert "UNBACKED_OUTCOME" in run_checks([done], tracked=lines[:1])
    assert "UNTRACKED_RUN" in run_checks([done], tracked=[*lines, {"ev": "start", "exec": None, "t": at(3)}])
    assert "UNRECORDED_RUN" in run_checks([done], tracked=[*lines, {"ev": "start", "exec": 9, "t": at(3)}])
    assert "RAN_UNCLAIMED" in run_checks([row(1, "PT3", 2, "SKIPPED", skip_reason="OVERLAP")], tracked=lines[:1])


def test_a_kwargs_edit_answered_by_a_database_error_allows_either_values_until_an_edit_saves() -> None:
    person = feature_checks.Person([
        {"ev": "kwargs", "t": at(10), "good": True, "values": {"region": "us"}, "uncertain": True},
        {"ev": "kwargs", "t": at(30), "good": True, "values": {"n": 3}}])
    assert person.kwargs_in_effect(at(5)) == [{}]
    assert person.kwargs_in_effect(at(20)) == [{}, {"region": "us"}]
    assert person.kwargs_in_effect(at(40)) == [{"n": 3}]


def test_a_run_told_a_history_other_than_its_claim_saw_is_reported() -> None:
    """run.previous / run.last_success: the newest earlier execution that had ended (succeeded) when the
    claim was made; rows that ended within the slack of the claim may go either way."""
    history = [row(1, "S02", 0, ended=1), row(2, "S02", 3, "FAILED", ended=4), row(3, "S02", 6, started=10, ended=11)]
    told = {"ev": "start", "job": "S02", "previous": 2, "last_success": 1}
    assert not run_checks(history, starts={(3, 3): told})
    assert "HISTORY_WRONG" in run_checks(history, starts={(3, 3): {**told, "previous": 1}})  # 2 had ended
    assert "HISTORY_WRONG" in run_checks(history, starts={(3, 3): {**told, "last_success": 2}})  # 2 failed
    assert "HISTORY_WRONG" in run_checks(history, starts={(3, 3): {**told, "previous": None}})
    assert "HISTORY_WRONG" in run_checks(history, starts={(1, 1): {**told, "previous": None, "last_success": 3}})
    first = {"ev": "start", "job": "S02", "previous": None, "last_success": None}
    assert not run_checks(history, starts={(1, 1): first})
    # An earlier slot that ended only after the claim was not seen: told the one before it.
    late = [row(1, "S02", 0, ended=1), row(2, "S02", 3, ended=20), row(3, "S02", 6, started=10, ended=11)]
    assert not run_checks(late, starts={(3, 3): {**told, "previous": 1}})
    assert "HISTORY_WRONG" in run_checks(late, starts={(3, 3): {**told, "previous": 2, "last_success": 1}})
    # A run whose message could not be sent never started (the first seed-1 run with this rule flagged
    # one): the run after it is told the one before.
    unsent = dataclasses.replace(row(2, "S02", 3, "FAILED", ended=3.1), started=None, fence=None,
                                 error_code="PUBLISH_FAILED")
    assert not run_checks([history[0], unsent, history[2]], starts={(3, 3): {**told, "previous": 1}})


def test_a_pause_that_ends_early_or_never_and_a_dispatch_while_paused_until_its_end_are_reported() -> None:
    from tests.soak import pause_checks

    t0 = T0.timestamp()
    lines = [{"ev": "pause", "job": "S04", "t": t0 + 10}, {"ev": "pause-ends", "job": "S04", "t": t0 + 10.1,
                                                           "until": t0 + 16},
             {"ev": "other", "t": t0 + 400}]

    def anomalies(ends: list[tuple[str, float]]) -> set[str]:
        result = Result()
        pause_checks.check(lines, ends, result)
        return {kind for kind, found in result.anomalies.items() if found}

    assert anomalies([("S04", t0 + 16.4)]) == set(), "ended by itself at its end"
    assert anomalies([("S04", t0 + 14)]) == {"PAUSE_ENDED_EARLY"}
    assert anomalies([]) == {"PAUSE_NOT_ENDED"}
    resumed = [*lines[:2], {"ev": "resume", "job": "S04", "t": t0 + 12}, lines[2]]
    result = Result()
    pause_checks.check(resumed, [], result)
    assert not any(result.anomalies.values()), "the person resumed it before its end"
    # Until its end it is paused; after it, its slots may be recorded again.
    during = [row(1, "S04", 14), row(2, "S04", 18)]
    found = run_checks(during, lines)
    assert len(found["DISPATCHED_WHILE_PAUSED"]) == 1 and "execution 1:" in found["DISPATCHED_WHILE_PAUSED"][0]


def test_a_job_that_pauses_itself_is_held_to_its_nth_failure_in_a_row() -> None:
    from tests.soak import pause_checks
    from tests.soak import spec as specs

    spec = specs.BY_CODE["S06"]
    assert spec.pause_after_failures == 2
    finals = [row(1, "S06", 0), row(2, "S06", 1, "FAILED"), row(3, "S06", 2, "FAILED"), row(4, "S06", 3, "FAILED"),
              row(5, "S06", 20, "FAILED")]
    resume = [{"ev": "resume", "job": "S06", "t": T0.timestamp() + 10}]
    expected, optional = pause_checks.paused_alerts(spec, finals, resume)
    # The second failure in a row pauses it; the third ends while it is paused; after the person's
    # resume the streak goes on, so the next failure pauses it again.
    assert (expected, optional) == ({(3, "PAUSED"), (5, "PAUSED")}, set())
    near = [{"ev": "resume", "job": "S06", "t": T0.timestamp() + 20.3}]  # resumed as the failure ended
    expected, optional = pause_checks.paused_alerts(spec, finals, near)
    assert expected == {(3, "PAUSED")} and optional == {(5, "PAUSED")}
    assert pause_checks.paused_alerts(specs.BY_CODE["S01"], finals, resume) == (set(), set())


def test_a_slot_check_skip_is_taken_only_beside_another_execution_of_its_slot(tmp_path: Path) -> None:
    """The person's run and a one-off of one instant (both without values) share a slot: the second
    to be claimed is SKIPPED ALREADY_RUNNING or ALREADY_RAN, as the slot check says. Alone, such a skip
    is an anomaly."""
    one_off = row(1, "S14", 100, trigger="ONE_OFF")
    skipped = row(2, "S14", 100, "SKIPPED", trigger="ENQUEUE", skip_reason="ALREADY_RAN", ended=101)
    skipped.created_at = one_off.created_at + dt.timedelta(seconds=0.5)

    def bad_skips(rows: list[Row]) -> list[str]:
        result = Result()
        for item in rows:
            checker._row(item, result, {}, {}, 3, {r.id: r for r in rows}, rows, set(), feature_checks.Person([]))
        return result.anomalies["BAD_SKIP"]

    assert bad_skips([one_off, skipped]) == []
    assert bad_skips([skipped]) and "no other execution of S14" in bad_skips([skipped])[0]
    # A twin whose message could not be sent never ran: it uses nothing up (the soak's seed 3).
    unsent = row(3, "S14", 100, "FAILED", trigger="ENQUEUE", ended=100.6)
    unsent.created_at = one_off.created_at + dt.timedelta(seconds=0.3)
    unsent.error_code, unsent.started = "PUBLISH_FAILED", None
    assert bad_skips([unsent, skipped]) and "no other execution of S14" in bad_skips([unsent, skipped])[0]


def test_a_missed_slot_whose_outage_alert_came_a_moment_later_is_judged_at_every_view_it_may_have_had() -> None:
    """The hour-long soak (seed 2027): the reconciler recorded PT1's 19:59:48 MISSED at .1006 s; the
    beat's MISSED 19:59:52 and its alert committed at .1366 s, before the reconciler's alert check ran,
    and 19:59:54 started at .469 s. Seen at any instant between .1366 and .469 the outage had alerted:
    no alert is right. With that alert seconds later, the outage alerted nobody."""
    def stamp(seconds: float) -> dt.datetime:
        return T0 + dt.timedelta(seconds=seconds)

    def judged(alert_at: float) -> dict[str, list[str]]:
        lone = row(1, "PT1", 48, "MISSED", ended=54.1006)
        ran = row(2, "PT1", 50, started=52.16, ended=52.48)
        beat = row(3, "PT1", 52, "MISSED", ended=54.0928)
        newer = row(4, "PT1", 54, started=54.469, ended=54.66)
        for missed in (lone, beat):
            missed.started = None
        result = Result()
        checker._missed_alerts("PT1", [lone, ran, beat, newer], [(9, 3, "PT1", "MISSED", "SENT", stamp(alert_at))],
                               result)
        return {kind: found for kind, found in result.anomalies.items() if found}

    assert judged(54.1366) == {}
    assert "ALERT_MISSING" in judged(58.0)


def test_an_overlap_skip_is_taken_beside_a_live_run_or_older_runs_waiting_and_not_alone() -> None:
    """A regular slot skipped OVERLAP met a live run of its job, or older runs of it waiting for its
    room (they go first); with neither, the skip is an anomaly."""
    skipped = row(1, "S01", 20, "SKIPPED", skip_reason="OVERLAP", ended=20.2)
    older = row(2, "S01", 10, trigger="CATCH_UP", started=21, ended=22)  # waited, then ran after the skip
    older.created_at = T0 + dt.timedelta(seconds=12)

    def found(rows: list[Row]) -> list[str]:
        result = Result()
        checker._row(skipped, result, {}, {}, 3, {r.id: r for r in rows}, rows, set(), feature_checks.Person([]))
        return result.anomalies["SKIP_WITHOUT_LIVE_RUN"]

    assert found([skipped, older]) == []
    assert found([skipped]) and "running or waiting before it" in found([skipped])[0]


def test_a_buffer_one_slot_skipped_while_no_other_regular_slot_waited_is_reported() -> None:
    """S07 (overlap buffer_one): a regular slot skipped beside a live run is right only while another
    regular slot of the job waited for it; alone beside the live run it should have waited itself."""
    live = row(1, "S07", 0, started=0, ended=7)
    skipped = row(3, "S07", 6, "SKIPPED", skip_reason="OVERLAP", ended=6.1)
    waited = row(2, "S07", 3, started=7, ended=9)  # recorded at its slot, waited, ran after the live one

    def found(rows: list[Row]) -> list[str]:
        result = Result()
        checker._row(skipped, result, {}, {}, 3, {r.id: r for r in rows}, rows, set(), feature_checks.Person([]))
        return result.anomalies["BUFFER_NOT_KEPT"]

    assert found([live, waited, skipped]) == []
    assert found([live, skipped]) and "while no other regular slot of it waited" in found([live, skipped])[0]
    ran_at_once = row(2, "S07", 3, started=3.2, ended=4)  # it did not wait: it had started before the skip
    assert found([live, ran_at_once, skipped])


def test_a_paused_skip_after_a_pauses_end_but_before_it_ended_by_itself_is_taken() -> None:
    """A pause with an end lasts until a beat or the reconciler ends it, as the audit log dates it: under
    faults that may be seconds after the end (the hour-long soak: a slot of S04 skipped PAUSED 3.5 s after
    the end, 0.7 s before the pause ended). A PAUSED skip after that is still an anomaly."""
    t0 = T0.timestamp()
    lines = [{"ev": "pause", "job": "S04", "t": t0 + 10}, {"ev": "pause-ends", "job": "S04", "t": t0 + 10.1,
                                                           "until": t0 + 16}]
    skipped = row(1, "S04", 12, "SKIPPED", skip_reason="PAUSED", ended=22)

    def found(ends: list[tuple[str, float]]) -> list[str]:
        result = Result()
        person = feature_checks.Person(lines, ends)
        feature_checks.check_all([skipped], {}, {}, [], person, result, jobs={}, window=(0.0, 0.0))
        return [text for text in result.anomalies["BAD_SKIP"] if "PAUSED" in text]

    assert found([("S04", t0 + 23)]) == [], "ended by itself at 23: paused at 22"
    assert found([("S04", t0 + 16.2)]), "ended by itself at 16.2: not paused at 22"
    assert found([]), "no end recorded: judged by its end"
