"""bench/memory.py's pure parts and its section of the page; beat_scale's figures at the largest N.

No worker, database or broker: /proc texts, samples and the fixture under ``tests/bench_results``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bench import beat_scale, common, memory, memory_section, sections
from bench.figures import TIMES, ResultError, Results
from tests.conftest import ROOT

FIXTURE = ROOT / "tests" / "bench_results"


def fixture_results() -> Results:
    """The fixture's manifest and the JSON of the two benchmarks these sections read."""
    manifest = json.loads((FIXTURE / "manifest.json").read_text(encoding="utf-8"))
    data = {name: json.loads((FIXTURE / f"{name}.json").read_text(encoding="utf-8"))
            for name in ("memory", "beat_scale")}
    return Results(manifest=manifest, data=data)


def taken(runs: int, main: float, *pool: float, pids: tuple[int, ...] = (11, 12)) -> dict[str, Any]:
    children = [{"pid": pid, "mib": mib} for pid, mib in zip(pids, pool, strict=False)]
    sample: dict[str, Any] = {"runs": runs, "main_mib": main, "children": children}
    sample["total_mib"] = memory.sample_total(sample)
    return sample


# ------------------------------------------------------------------------------- /proc


def test_resident_memory_is_read_from_the_status_text():
    text = "Name:\tcelery\nVmPeak:\t  300000 kB\nVmRSS:\t   81920 kB\nRssAnon:\t   40000 kB\n"
    assert common.status_kib(text) == 81920
    assert common.status_kib(text, "RssAnon") == 40000
    assert common.status_kib("Name:\tkthreadd\n") is None  # a kernel thread has no VmRSS


def test_pool_processes_are_found_by_their_parent_even_with_odd_names():
    stats = {
        100: "100 (python) S 1 100 100 0 -1",
        101: "101 (celery (pool) 1) S 100 100 100 0 -1",  # parentheses and spaces in the name
        102: "102 (python) R 100 100 100 0 -1",
        103: "103 (python) S 101 100 100 0 -1",  # a grandchild is not a pool process
        104: "104 (bash) S 1000 104 104 0 -1",
    }
    assert memory.children_from_stats(stats, 100) == [101, 102]


# ----------------------------------------------------------------------------- growth


def test_growth_is_measured_from_ten_thousand_runs_to_the_last():
    samples = [taken(0, 80.0, 70.0, 70.0), taken(1000, 84.0, 75.0, 75.0), taken(10_000, 85.0, 76.0, 76.0),
               taken(100_000, 85.5, 77.0, 76.5)]
    found = memory.growth(samples)
    assert (found["from_runs"], found["to_runs"]) == (10_000, 100_000)
    assert [p["change_mib"] for p in found["processes"]] == [0.5, 1.0, 0.5]
    assert found["total_change_mib"] == pytest.approx(2.0)
    assert found["per_10k_runs_mib"] == pytest.approx(2.0 * 10_000 / 90_000, abs=0.01)
    assert found["flat"] is True


def test_a_process_that_keeps_growing_is_named_and_a_replaced_one_marked():
    samples = [taken(0, 80.0, 70.0, 70.0), taken(500, 80.0, 70.0, 70.0),
               taken(5000, 80.5, 90.0, 70.0, pids=(11, 13))]
    found = memory.growth(samples)  # no 10,000 sample: from the first at a tenth of the last (500)
    assert found["from_runs"] == 500
    one, two = found["processes"][1:]
    assert (one["change_mib"], one["within_noise"], one["replaced"]) == (20.0, False, False)
    assert (two["change_mib"], two["within_noise"], two["replaced"]) == (0.0, True, True)
    assert found["flat"] is False


def test_checkpoints_are_increasing_counts():
    assert memory.parse_checkpoints("10_000,100000") == (10_000, 100_000)
    for bad in ("100,10", "0,5", "ten", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            memory.parse_checkpoints(bad)


# ---------------------------------------------------------------------------- the page


def test_the_memory_section_has_each_checkpoint_and_the_growth_of_each_worker():
    text = "\n".join(memory_section.memory_section(fixture_results()))
    assert text.startswith("## Worker memory over a long run\n")
    assert "| 5,000 | 62.5 MiB | 61.0 MiB + 60.5 MiB | 184.0 MiB | 60.0 MiB | 66.0 MiB + 64.0 MiB | 190.0 MiB |" in text
    assert ("- cron_task (tracked): from 500 to 5,000 runs, main +0.5 MiB, pool process 1 +1.0 MiB, "
            "pool process 2 +0.5 MiB; in all +2.0 MiB") in text
    assert "within the noise (a process may move by 2.0 MiB or 3% of its size)" in text
    assert "**grew beyond the noise**" in text  # the peer's pool processes, in the fixture
    assert f"{TIMES}0.97 the peer's 190.0 MiB" in text
    assert "`bench/memory.py --quick` — a **quick run**" in text


def test_memory_results_without_samples_are_a_clear_error():
    results = fixture_results()
    results.data["memory"]["results"] = {}
    with pytest.raises(ResultError, match=r"memory\.json has no results"):
        memory_section.memory_section(results)


def test_the_beat_section_shows_the_size_measured_alone_and_how_each_figure_grew():
    results = fixture_results()
    data = results.data["beat_scale"]
    assert sorted(sections.beat_ratios(data)) == [10, 1000]  # 100,000 has no DatabaseScheduler to compare
    text = "\n".join(sections.beat_section(results))
    assert "| 100,000 | cron_celery alone | 30.0 s | 8.000 s | 0.30 ms |" in text
    assert "N = 10, 1,000, 100,000 (100,000: cron_celery alone)." in text
    assert "| 100,000 | 3.000 s | 30.0 s | 8.000 s | 0.30 ms |" in text
    assert "| 50.0 MiB | 200.0 MiB | 220.0 MiB | 2.05 KiB |" in text
    assert "| 100,000 | 5.000 s (10; 200,001) | 20.00 ms (5; 50) |" in text
    assert f"From N = 1,000 to N = 100,000 ({TIMES}100), what each figure did:" in text
    assert f"- idle tick: 0.20 ms to 0.30 ms, {TIMES}1.50: flat (should be flat)." in text
    assert f"- memory with the scheduler built: 2.00 MiB to 200.00 MiB, {TIMES}100.0: linear (should be linear)." \
        in text
    assert f"- history: 205 rows read to 205, {TIMES}1.00: flat (should be flat)" in text


def test_a_page_that_reads_every_job_is_called_out():
    results = fixture_results()
    pages = results.data["beat_scale"]["results"]["100000"]["cron_celery"]["pages"]
    pages["history"]["rows_read"] = 100_103
    text = "\n".join(sections.beat_section(results))
    assert f"- history: 205 rows read to 100,103, {TIMES}488.3: **faster than N** (should be flat)" in text


def test_older_beat_results_have_no_figures_at_scale_and_a_pair_is_still_needed(tmp_path: Path):
    results = fixture_results()
    data = results.data["beat_scale"]
    for pair in data["results"].values():
        for key in ("memory", "pages", "sync_command"):
            pair["cron_celery"].pop(key, None)
    assert "memory, the sync command" not in "\n".join(sections.beat_section(results))
    data["settings"]["alone_from"] = None  # 100,000 without DatabaseScheduler, not asked for
    with pytest.raises(ResultError, match="N = 100000 without both schedulers"):
        sections.beat_ratios(data)


def test_the_beat_benchmark_measures_the_largest_sizes_alone():
    chosen = ["dbs", "cron_celery", "cron_celery_jitter"]
    assert beat_scale.measured_at(10_000, chosen, 100_000) == chosen
    assert beat_scale.measured_at(100_000, chosen, 100_000) == ["cron_celery"]
    assert beat_scale.measured_at(100_000, chosen, None) == chosen
    assert beat_scale.measured_at(100_000, ["dbs"], 100_000) == []
