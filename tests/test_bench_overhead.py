"""bench/overhead.py's own arithmetic and rendering: pg_test_fsync's output, the ratios and per-run
gaps with and without durable commits, py-spy's stacks and the page's overhead section. Pure: no
service is used (``tests/bench_results/`` holds round figures)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import flame, overhead_figures, page, sections
from tests.conftest import ROOT

FIXTURE = ROOT / "tests" / "bench_results"

PG_TEST_FSYNC = """\
5 seconds per test
O_DIRECT supported on this platform for open_datasync and open_sync.

Compare file sync methods using one 8kB write:
(in wal_sync_method preference order, except fdatasync is Linux's default)
        open_datasync                      5000.000 ops/sec     200 usecs/op
        fdatasync                          8000.000 ops/sec     125 usecs/op
        fsync                              6848.593 ops/sec     146 usecs/op
        fsync_writethrough                              n/a
        open_sync                          7740.070 ops/sec     129 usecs/op

Compare file sync methods using two 8kB writes:
(in wal_sync_method preference order, except fdatasync is Linux's default)
        open_datasync                      3552.663 ops/sec     281 usecs/op
        fdatasync                          1000.000 ops/sec    1000 usecs/op
"""


def test_pg_test_fsync_is_read_from_its_one_write_table():
    found = overhead_figures.parse_pg_test_fsync(PG_TEST_FSYNC)["usecs_per_op"]
    assert found["fdatasync"] == pytest.approx(125.0)  # the one-write figure, not the two-write one
    assert found["open_datasync"] == pytest.approx(200.0)
    assert found["fsync_writethrough"] is None
    assert overhead_figures.parse_pg_test_fsync("no such table")["usecs_per_op"] == {}


def test_the_summary_gives_ratios_and_per_run_gaps_with_and_without_durable_commits():
    rates = {"bare": [1000.0], "results": [400.0, 500.0], "tracked": [500.0, 400.0],
             "results-commit-off": [800.0, 1000.0], "tracked-commit-off": [1000.0, 1000.0]}
    found = overhead_figures.summarise(rates, concurrency=2)
    assert found["ratios"] == pytest.approx({"bare": 0.45, "results": 1.0, "results-commit-off": 1000 / 900})
    assert found["per_repeat"]["results-commit-off"] == pytest.approx([1.25, 1.0])
    assert found["gap_us"]["durable"] == pytest.approx(0.0)
    assert found["gap_us"]["commit_off"] == pytest.approx(2 * (1 / 1000 - 1 / 900) * 1e6)
    lines = overhead_figures.summary_lines(found, {"measured": True, "method": "fdatasync", "usecs": 125.0})
    assert lines[0].startswith("(iii)/(i)   = 0.45") and "(iii*)/(ii*) = 1.11   (each repeat: 1.25, 1.00)" in lines
    assert lines[-2] == ("a tracked run holds its pool process +0 µs more than (ii)'s task; -222 µs with "
                         "synchronous_commit off")
    assert lines[-1] == "one WAL flush here (fdatasync, pg_test_fsync): 125 µs"
    alone = overhead_figures.summarise({"tracked": [300.0]}, concurrency=2)
    assert alone["ratios"] == {} and alone["gap_us"] == {"durable": None, "commit_off": None}


RAW = """\
process 10:"celery worker";thread (10): MainThread;main (celery/bin/worker.py);\
Hub.create_loop (kombu/asynchronous/hub.py) 7
process 10:"celery worker";process 11:"celery worker";thread (11): MainThread;main (celery/bin/worker.py);\
Worker.workloop (billiard/pool.py);fast_trace_task (celery/app/trace.py);\
TrackedTask.__call__ (cron_celery/run/tasks.py);\
execute (cron_celery/run/runs.py);_claim_new (cron_celery/decisions/claims.py);Connection.wait (psycopg/connection.py) 6
process 10:"celery worker";process 11:"celery worker";thread (11): MainThread;main (celery/bin/worker.py);\
Worker.workloop (billiard/pool.py);fast_trace_task (celery/app/trace.py);\
TrackedTask.__call__ (cron_celery/run/tasks.py);\
execute (cron_celery/run/runs.py);call_job (cron_celery/run/runs.py);tracked_noop (bench/tasks.py) 2
process 10:"celery worker";process 12:"celery worker";thread (12): MainThread;main (celery/bin/worker.py);\
Worker.workloop (billiard/pool.py);wait_for_job (billiard/pool.py) 2
process 10:"celery worker";process 12:"celery worker";thread (13): cron-celery-leases;\
_loop (cron_celery/run/leases.py) 9
py-spy> a line that is not a stack
"""


def test_py_spy_stacks_are_cut_to_the_pool_processes_and_summed_up():
    stacks = flame.parse(RAW)
    assert len(stacks) == 5 and {stack.pid for stack in stacks} == {10, 11, 12}
    pool = flame.pool_main_threads(stacks)
    assert flame.total(pool) == 10  # the parent's loop and the lease thread are left out
    assert all(stack.frames[0] != "Worker.workloop (billiard/pool.py)" for stack in pool)
    found = flame.summary(pool)
    shares = {item["what"]: item["share"] for item in found["buckets"]}
    assert shares["the claim (SQL, its commit included)"] == pytest.approx(0.6)
    assert shares["the body (one Redis INCR)"] == pytest.approx(0.2)
    assert shares["waiting for the next task, and the pool's messaging"] == pytest.approx(0.2)
    assert found["in_task"] == 8
    assert found["leaves"][0] == {"function": "Connection.wait (psycopg/connection.py)", "share_of_task": 0.75}
    drawing = flame.svg(pool, "a <title> & more")
    assert drawing.startswith("<svg") and drawing.rstrip().endswith("</svg>")
    assert "a &lt;title&gt; &amp; more" in drawing
    assert "_claim_new (cron_celery/decisions/claims.py): 6 samples, 60.0%" in drawing


def test_the_page_shows_both_ratios_the_gaps_and_one_wal_flush():
    text = page.render(page.load(FIXTURE))
    section = text[text.index("### With the commit cost taken out"):text.index("### Where a tracked run's time goes")]
    assert "| durable commits (the figures above) | **1.00** | 1.12, 0.90 |" in section
    assert "| `synchronous_commit = off` on both sides | **1.11** | 1.12, 1.10 |" in section
    assert "2 \u00d7 (1 ÷ (iii) - 1 ÷ (ii)) | **0 µs** |" in section
    assert "| the same with `synchronous_commit = off` on both sides | -222 µs |" in section
    assert "| what the durable commits add: the difference | 222 µs |" in section
    assert "beside the data directory) | **150 µs** |" in section
    assert "at least 1.00: **met**; the durable gap at most one WAL flush: **met**" in section
    profiled = text[text.index("### Where a tracked run's time goes"):text.index("### SQL per run")]
    assert "| the claim (SQL, its commit included) | 30.0% |" in profiled
    assert "| `Connection.wait (psycopg/connection.py)` | 60.0% |" in profiled
    assert "(img/tracked-run-flame.svg)" in profiled


def test_a_run_without_the_commit_off_variants_or_a_profile_says_so(tmp_path: Path):
    directory = Path(shutil.copytree(FIXTURE, tmp_path / "results"))
    path = directory / "overhead.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["runs"] = [run for run in data["runs"] if not run["variant"].endswith("commit-off")]
    data["fsync"] = {"measured": False, "why": "pg_test_fsync is not installed", "method": "fdatasync"}
    data["profile"] = {"error": "--profile needs py-spy"}
    path.write_text(json.dumps(data), encoding="utf-8")
    lines = "\n".join(sections.overhead_section(page.load(directory)))
    assert "did not measure (ii) and (iii) with `synchronous_commit = off`" in lines
    assert "Not profiled: --profile needs py-spy." in lines
    data["runs"] = json.loads((FIXTURE / "overhead.json").read_text(encoding="utf-8"))["runs"]
    path.write_text(json.dumps(data), encoding="utf-8")
    lines = "\n".join(sections.overhead_section(page.load(directory)))
    assert "not measured (pg_test_fsync is not installed)" in lines
    assert "the durable gap at most one WAL flush: **\u2013**" in lines


def overhead_data(*, tracked: float, results: float, tracked_off: float, results_off: float,
                  in_process_off: tuple[float, float]) -> dict[str, Any]:
    """overhead.json as the page reads it: one repeat of each variant, and the in-process timing."""
    medians = {"tracked": tracked, "results": results, "tracked-commit-off": tracked_off,
               "results-commit-off": results_off}
    return {"medians": medians, "settings": {"concurrency": 2}, "fsync": None,
            "runs": [{"variant": key, "rate": rate, "repeat": 1} for key, rate in medians.items()],
            "statements": {"commit_cost": {"tracked_ms_async_commit": in_process_off[0],
                                           "results_ms_async_commit": in_process_off[1],
                                           "tracked_wal_bytes": 2300.0, "results_wal_bytes": 930.0}}}


def test_what_is_left_is_explained_only_when_the_figures_show_it():
    # Quicker in one process, slower through the worker; the durable commits cost 2 x (1/400 - 1/450)
    # - 2 x (1/450 - 1/500) = 111 us a run more than the code.
    data = overhead_data(tracked=400, results=450, tracked_off=450, results_off=500, in_process_off=(1.05, 1.29))
    said = "\n".join(sections.overhead_what_is_left(data, 2))
    assert "a tracked run is the quicker call (1.050 against 1.290 ms" in said
    assert "yet through a worker it is the slower. There 2 pool processes" in said
    assert "(the WAL below)" in said
    assert "What the durable commits added (111 µs a run) is the claim's own commit" in said

    faster = overhead_data(tracked=400, results=450, tracked_off=520, results_off=500, in_process_off=(1.05, 1.29))
    said = "\n".join(sections.overhead_what_is_left(faster, 2))  # the faster through the worker too
    assert "quicker call" not in said
    slower_in_process = overhead_data(tracked=400, results=450, tracked_off=450, results_off=500,
                                      in_process_off=(1.40, 1.29))
    assert "quicker call" not in "\n".join(sections.overhead_what_is_left(slower_in_process, 2))

    # Durable gap below the commits-off gap (noise): no claim about the flush.
    noisy = overhead_data(tracked=440, results=486, tracked_off=489, results_off=551, in_process_off=(1.05, 1.29))
    said = "\n".join(sections.overhead_what_is_left(noisy, 2))
    assert "added nothing measurable in this run (-30 µs a run" in said
    assert "claim's own commit" not in said
