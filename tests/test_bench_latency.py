"""bench/latency.py's arithmetic: the slots it expects, the percentiles, the minutes, the table.

Pure functions only: no process is started and nothing is timed.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import latency, latency_mix, latency_section, page
from bench.latency import Sample

MINUTE = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC).timestamp()


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert latency.percentile(values, 0.50) == 50
    assert latency.percentile(values, 0.95) == 95
    assert latency.percentile(values, 0.99) == 99
    assert latency.percentile([3.0, 1.0, 2.0], 0.99) == 3  # the top one of a short list
    assert latency.percentile([7.0], 0.5) == 7


def test_spread_of_no_values_has_a_count_and_nothing_else():
    assert latency.spread([]) == {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    assert latency.spread([0.2, 0.1]) == {"n": 2, "p50": 0.1, "p95": 0.2, "p99": 0.2, "max": 0.2}


def test_delays_count_only_the_steps_that_happened():
    samples = [Sample(slot=MINUTE, published=MINUTE + 0.5, started=MINUTE + 1.0),
               Sample(slot=MINUTE + 60, published=MINUTE + 60.25)]
    assert latency.delays(samples, "published") == [0.5, 0.25]
    assert latency.delays(samples, "started") == [1.0]
    assert latency.delays(samples, "ended") == []


def test_a_slot_is_done_in_its_minute_only_if_its_final_write_came_before_the_next():
    expected = {MINUTE: 3, MINUTE + 60: 2}
    samples = [
        Sample(slot=MINUTE, ended=MINUTE + 59.9),  # done
        Sample(slot=MINUTE, ended=MINUTE + 60.0),  # on the next boundary: not done
        Sample(slot=MINUTE, ended=None),  # never ended (the third expected slot is not even seen)
        Sample(slot=MINUTE + 60, ended=MINUTE + 61),
        Sample(slot=MINUTE + 120, ended=MINUTE + 121),  # past the window: not counted
    ]
    assert latency.done_in_minute(samples, expected) == [
        {"minute": "12:00", "expected": 3, "done": 1},
        {"minute": "12:01", "expected": 2, "done": 1},
    ]


def test_a_ten_second_slot_counts_in_the_minute_it_falls_in():
    samples = [Sample(slot=MINUTE + 50, ended=MINUTE + 59), Sample(slot=MINUTE + 50.4, ended=MINUTE + 65)]
    assert latency.done_in_minute(samples, {MINUTE: 2}) == [{"minute": "12:00", "expected": 2, "done": 1}]


def test_throughput_is_over_the_busy_seconds_and_the_best_five():
    ends = [MINUTE + 0.1 * k for k in range(20)]  # 10 in second 0, 10 in second 1
    ends += [MINUTE + 30.5] * 5  # one more busy second, after an idle stretch
    figures = latency.throughput(ends)
    assert figures["completions"] == 25
    assert figures["busy_s"] == 3
    assert figures["per_s"] == pytest.approx(25 / 3)
    assert figures["peak_per_s"] == pytest.approx(20 / 5)
    assert latency.throughput([]) == {"completions": 0, "busy_s": 0, "per_s": 0.0, "peak_per_s": 0.0}


def test_the_minute_mix_has_one_slot_per_job_per_minute():
    assert latency_mix.expected_per_minute(1000, "minute", MINUTE, 2) == {MINUTE: 1000, MINUTE + 60: 1000}


def test_the_mix_adds_six_slots_per_ten_second_job_and_the_hourly_at_the_hour():
    counts = latency_mix.kinds(100, "mix")
    assert counts == {"minute": 70, "10s": 10, "hourly": 10, "daily": 10}
    midnight = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()
    # 12:00: every-minute, six 10 s slots each, and the hourly ones; 12:01: no hourly.
    assert latency_mix.expected_per_minute(100, "mix", MINUTE, 2) == {MINUTE: 70 + 60 + 10, MINUTE + 60: 70 + 60}
    assert latency_mix.expected_per_minute(100, "mix", midnight, 1) == {midnight: 70 + 60 + 10 + 10}


def test_slots_and_next_slots_are_aligned_to_the_epoch():
    assert latency_mix.slots_between("10s", MINUTE - 5, MINUTE + 20) == [MINUTE, MINUTE + 10]
    assert latency_mix.next_slot("minute", MINUTE) == MINUTE + 60  # strictly after
    assert latency_mix.next_slot("minute", MINUTE - 0.3) == MINUTE
    assert latency_mix.kind_from_name(latency_mix.job_name(7, "10s")) == "10s"
    assert latency_mix.kind_from_name("celery.backend_cleanup") is None
    with pytest.raises(ValueError, match="unknown mix"):
        latency_mix.kind_of(0, "hourly")


def test_dispatch_rounds_are_read_from_the_beats_log_lines():
    text = ("1.0 cron_celery.beat cron_celery beat: dispatched 1000 slot(s) of 1000 job(s) in 400 ms (1000 sent)\n"
            "2.0 cron_celery.beat cron_celery beat: dispatched 10 slot(s) of 10 job(s) in 10 ms (10 sent)\n")
    rounds = latency.dispatch_rounds(text)
    assert rounds["rounds"] == 2 and rounds["largest"] == 1000 and rounds["ms_max"] == 400
    assert rounds["slots_per_s"] == pytest.approx(1010 / 0.41)
    assert latency.dispatch_rounds("") == {"rounds": 0}


def result(side: str, samples: list[Sample], expected: dict[float, int], **extra: object) -> dict[str, object]:
    figures = latency.summarize(samples, expected)
    figures.update({"window": [latency.utc(MINUTE).isoformat(), latency.utc(MINUTE + 60).isoformat()], **extra})
    return figures


def test_the_table_shows_each_step_the_minutes_and_the_workers_per_scheduler():
    cron = [Sample(slot=MINUTE, recorded=MINUTE + 0.01, handed=MINUTE + 0.015, published=MINUTE + 0.02,
                   started=MINUTE + 0.05, ended=MINUTE + 2.5)] * 2
    dbs = [Sample(slot=MINUTE, published=MINUTE + 1.5, started=MINUTE + 1.6, ended=MINUTE + 1.7)]
    results = {"2": {
        "cron_celery": result("cron_celery", cron, {MINUTE: 2},
                              dispatch={"rounds": 1, "largest": 2, "ms_p50": 12.0, "ms_max": 12.0}),
        "dbs": result("dbs", dbs, {MINUTE: 2}, drained=False),
    }}
    text = "\n".join(latency.render(results, {"mix": "minute", "minutes": 1, "workers": 2, "concurrency": 2}))
    assert "N = 2 (minute), 1 minute(s) from 12:00 UTC, 2 slots; 2 worker(s) x 2" in text
    lines = text.splitlines()
    recorded = next(line for line in lines if "slot → recorded" in line)
    assert recorded.split()[:2] == ["cron_celery", "slot"] and "2/2" in recorded and "10 ms" in recorded
    final = next(line for line in lines if "slot → final write" in line)
    assert "2.50 s" in final
    body_end = next(line for line in lines if "slot → body end" in line)
    assert "1/2" in body_end and "1.70 s" in body_end
    # DatabaseScheduler records no row, and sends outside a batch: those steps are cron_celery's only.
    assert sum("slot → recorded" in line for line in lines) == 1
    assert sum("slot → handed to kombu" in line for line in lines) == 1
    assert "done before the next minute: 12:00 2/2" in text
    assert "done before the next minute: 12:00 1/2" in text
    assert "beat: 1 dispatch round(s), largest 2 slots, 12 ms median" in text
    assert "(stopped by --drain-cap before every window slot had ended)" in text


def test_seconds_are_shown_in_milliseconds_below_one():
    assert latency.seconds(0.0123) == "12 ms"
    assert latency.seconds(1.5) == "1.50 s"
    assert latency.seconds(None) == "-"


# ------------------------------------------------------------------------ the page's section


def side(p99_published: float, *, expected: int = 1000, seen: int | None = None, per_s: float = 150.0,
         done: int = 900) -> dict[str, Any]:
    """A results entry as bench/latency.py writes it, with the figures a test sets."""
    figures = {"n": expected if seen is None else seen, "p50": p99_published / 2, "p95": p99_published,
               "p99": p99_published, "max": p99_published + 0.1}
    later = {key: (value + 1 if isinstance(value, float) else value) for key, value in figures.items()}
    return {"expected": expected, "seen": expected,
            "delays": {"recorded": figures, "handed": figures, "published": figures, "started": later,
                       "ended": later},
            "per_minute": [{"minute": "12:00", "expected": expected, "done": done}],
            "throughput": {"completions": expected, "busy_s": 10, "per_s": per_s, "peak_per_s": per_s * 1.2},
            "dispatch": {"rounds": 2, "largest": 500, "ms_p50": 120.0, "ms_max": 180.0, "slots_per_s": 4000.0},
            "drained": True, "window": ["2026-01-01T12:00:00+00:00", "2026-01-01T12:01:00+00:00"]}


def test_the_targets_are_judged_at_their_sizes_and_need_every_slot_published():
    results = {"1000": {"cron_celery": side(0.4)}, "10000": {"cron_celery": side(6.0, expected=10_000)}}
    lines = latency_section.targets(results)
    assert lines == ["- 1,000 jobs: slot → published p99 400 ms (target at most 1 s: met).",
                     "- 10,000 jobs: slot → published p99 6.00 s (target at most 5 s: **not met**)."]
    # Fast but not every slot published: not met; and a size the run did not measure says so.
    lines = latency_section.targets({"1000": {"cron_celery": side(0.4, seen=990)}})
    assert "**not met**" in lines[0] and "not measured in this run" in lines[1]


def test_the_capacity_line_says_whether_the_workers_bound_the_end_of_the_slots():
    kept_up = latency_section.capacity(1000, side(0.4, per_s=150.0), 2, 2)
    assert "landed over 10 s, 150/s" in kept_up and "they kept up" in kept_up
    busy = side(6.0, per_s=120.0)
    busy["throughput"]["busy_s"] = 84
    line = latency_section.capacity(10_000, busy, 2, 2)
    assert "about 83 s of work" in line and "capacity, not the beat" in line


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    """A copy of the page tests' results directory (tests/bench_results) that a test may change."""
    return Path(shutil.copytree(Path(__file__).parent / "bench_results", tmp_path / "results"))


def test_the_section_compares_each_size_with_database_scheduler(results_dir: Path) -> None:
    path = results_dir / "latency.json"
    data = json.loads(path.read_text())
    data["results"] = {"1000": {"cron_celery": side(0.4), "dbs": side(4.0, done=500)}}
    path.write_text(json.dumps(data))
    text = "\n".join(latency_section.latency_section(page.load(results_dir)))
    assert "| 1,000 | cron_celery | 1,000 / 1,000 | 200 ms | 400 ms | 500 ms |" in text
    assert "|  | DatabaseScheduler | 1,000 / 1,000 | 2.00 s | 4.00 s |" in text
    assert "|  | **cron_celery ÷ DBS** |  | 0.10 | **0.10** | 0.12 |" in text
    assert "900 / 1,000" in text and "500 / 1,000" in text
    data["results"] = {"1000": {"dbs": side(4.0)}}
    path.write_text(json.dumps(data))
    with pytest.raises(latency_section.ResultError, match="without cron_celery"):
        latency_section.latency_section(page.load(results_dir))
