"""docs/benchmarks.md is rendered from the benchmarks' JSON: ratios, sections, and errors.

``tests/bench_results/`` is a results directory as ``./scripts/bench --quick`` leaves it
(the scripts' own JSON and the manifest), with round figures put in so that the expected
ratios are easy to check by hand. No service is used.
"""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench import figures, page, run, sections
from bench.common import BenchError
from tests import test_docs
from tests.conftest import ROOT

FIXTURE = ROOT / "tests" / "bench_results"
#: The headings other pages may link to; they must survive every regeneration.
ANCHORS = ("the-cost-of-tracking-a-run", "locks", "beat-at-scale", "history-at-a-million-rows")


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    """A copy of the fixture directory that a test may change."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "results"))


def edit(directory: Path, name: str, change: Any) -> None:
    path = directory / name
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def rendered(directory: Path = FIXTURE) -> str:
    return page.render(page.load(directory))


# ------------------------------------------------------------------------------ ratios


def test_overhead_ratios_are_tracked_over_each_peer():
    data = page.load(FIXTURE).data["overhead"]
    # medians: bare 1000, results (400, 500) -> 450, tracked 450, once 900
    assert sections.overhead_ratios(data) == pytest.approx({"bare": 0.45, "results": 1.0, "once": 0.5})
    assert sections.overhead_ratios_per_repeat(data) == {
        "bare": pytest.approx([0.45, 0.45]), "results": pytest.approx([1.125, 0.9]),
        "once": pytest.approx([0.5, 0.5]),
    }


def test_the_commit_cost_section_shows_the_difference_with_and_without_the_wal_flush(results_dir: Path):
    assert "Where the difference from (ii) goes" not in rendered()  # older results: no section
    cost = {"tracked_ms": 1.5, "results_ms": 1.2, "tracked_ms_async_commit": 1.25, "results_ms_async_commit": 1.15}
    edit(results_dir, "overhead.json", lambda data: data["statements"].__setitem__("commit_cost", cost))
    text = rendered(results_dir)
    section = text[text.index("### Where the difference from (ii) goes"):]
    assert "| difference | **0.300 ms** | 0.100 ms |" in section
    assert "| (iii) tracked run | 1.500 ms | 1.250 ms |" in section
    assert "bytes** of WAL" not in section  # results from before it was measured: no line


def test_the_commit_cost_section_gives_the_wal_each_call_wrote(results_dir: Path):
    cost = {"tracked_ms": 1.5, "results_ms": 1.2, "tracked_ms_async_commit": 1.25, "results_ms_async_commit": 1.15,
            "tracked_wal_bytes": 2346.4, "results_wal_bytes": 951.0,
            "tracked_wal_bytes_async_commit": 2340.0, "results_wal_bytes_async_commit": 950.0}
    edit(results_dir, "overhead.json", lambda data: data["statements"].__setitem__("commit_cost", cost))
    text = rendered(results_dir)
    section = text[text.index("### Where the difference from (ii) goes"):]
    assert "Each call wrote **2,346 bytes** of WAL for a tracked run and 951 bytes for a" in section


def test_lock_ratios_are_against_pottery_and_the_floor():
    ratios = sections.lock_ratios(page.load(FIXTURE).data["locks"])
    assert ratios["cron1"] == pytest.approx(840 / 800)
    assert ratios["cron3"] == pytest.approx(1900 / 2000)
    assert ratios["raw_floor"] == 1
    assert ratios["pottery1_floor"] == pytest.approx(4.0)
    assert ratios["cron3_floor"] == pytest.approx(9.5)


def test_beat_ratios_are_per_size_and_use_the_extrapolated_burst():
    ratios = sections.beat_ratios(page.load(FIXTURE).data["beat_scale"])
    assert sorted(ratios) == [10, 1000]
    assert ratios[10]["idle_median"] == pytest.approx(2.0)
    assert ratios[1000]["idle_median"] == pytest.approx(0.05)
    assert ratios[1000]["edit"] == pytest.approx(10 / 200)
    assert ratios[1000]["edit_rows"] == pytest.approx(11 / 1010)
    assert ratios[1000]["build_restart"] == pytest.approx(0.25)
    # DatabaseScheduler stopped at the cap: 1000 slots extrapolated to 50 s; cron_celery took 1 s
    assert ratios[1000]["burst_time"] == pytest.approx(1 / 50)
    assert ratios[1000]["burst_rate"] == pytest.approx(1000 / 20)


def test_history_figures_against_the_targets():
    found = sections.history_figures(page.load(FIXTURE).data["history"])
    assert found["purge_x_target"] == pytest.approx(2.0)
    assert found["pages"][0]["median_x_target"] == pytest.approx(1.2)
    assert found["pages"][0]["within"] is False
    assert all(p["within"] for p in found["pages"][1:])
    assert found["slowest_ms"] == 120.0


def test_a_missing_figure_is_reported_by_what_it_lacks(results_dir: Path):
    edit(results_dir, "overhead.json", lambda data: data["medians"].pop("once"))
    with pytest.raises(figures.ResultError, match="celery-once"):
        page.render(page.load(results_dir))


@pytest.mark.parametrize(("value", "text"), [
    (None, figures.DASH), (0.0643, "0.064"), (0.45, "0.45"), (1.125, "1.12"), (13.4, "13.4"),
])
def test_ratio_formatting(value: float | None, text: str):
    assert figures.fmt_ratio(value) == text


# -------------------------------------------------------------------------------- page


def test_the_page_has_its_header_every_section_and_the_ratios():
    text = rendered()
    assert text.startswith("# Benchmarks\n\nGenerated by `./scripts/bench` on 2026-11-30 04:33 UTC; "
                           "do not edit by hand.\n")
    for heading in ("## The cost of tracking a run", "## Locks", "## Beat at scale",
                    "## History at a million rows", "### Purge throughput", "## This run"):
        assert f"\n{heading}\n" in text
    assert "2 CPUs (Intel(R) Xeon(R) Processor)" in text
    assert "load average 0.63 / 0.44 / 0.23 at the start" in text
    assert "`0123456789`" in text and "`./scripts/bench --quick`" in text
    assert "Celery 5.7.0" in text and "celery-once 3.0.1" in text and "pottery 3.0.1" in text
    assert "ratios within one run" in text
    # tracked (iii) against each peer: ratio of the medians, then each repeat's
    assert "| (i) bare Celery | **0.45** | 0.45, 0.45 |" in text
    assert "| (ii) django-celery-results | **1.00** | 1.12, 0.90 |" in text
    assert "| (iv) celery-once `QueueOnce` | **0.50** | 0.50, 0.50 |" in text
    assert "| (iii) cron_celery `cron_task` | 450 | 150 | **3.00** |" in text  # with / without DB reuse
    assert "| cron_celery JobLock | 1 | 840 | 1,680 | 4.20 | **1.05** |" in text
    assert "| cron_celery JobLock | 3 | 1,900 | 3,800 | 9.50 | **0.95** |" in text
    assert "| 1,000 | DBS |" in text and "~50.0 s extrapolated (600 in the first 30 s)" in text
    assert "| **cron_celery ÷ DBS** | 1.60 | 0.25 | **0.050** | 0.050 | **0.050** (0.011) | **0.020** | 50.0 |" in text
    assert "**100,000 rows/s**" in text and f"2.00 {figures.TIMES} the target of 50,000 rows/s" in text
    assert "Every page within the targets: **no**" in text


def test_a_quick_run_says_so_and_a_full_one_does_not(results_dir: Path):
    text = rendered(results_dir)
    assert "**Quick run.** All the figures below" in text
    assert "not a million" in text  # 20,000 rows seeded

    def full(manifest: dict[str, Any]) -> None:
        for entry in manifest["benchmarks"].values():
            entry["quick"] = False
        manifest["runs"][0]["quick"] = False

    edit(results_dir, "manifest.json", full)
    edit(results_dir, "history.json", lambda data: data["settings"].update(rows=1_000_000))
    text = rendered(results_dir)
    assert "Quick run" not in text and "quick run" not in text
    assert "not a million" not in text


def test_beat_targets_are_judged_only_at_their_size(results_dir: Path):
    assert "judged at 10,000 jobs, not measured in this run" in rendered(results_dir)

    def at_ten_thousand(data: dict[str, Any]) -> None:
        data["results"]["10000"] = data["results"].pop("1000")
        data["results"]["10000"]["cron_celery"]["idle"]["median_ms"] = 0.3  # 0.075 of DBS's 4 ms

    edit(results_dir, "beat_scale.json", at_ten_thousand)
    text = rendered(results_dir)
    assert "target at most 5%: **not met**" in text
    assert "(target 10 s: met)" in text
    assert "judged at 10,000 jobs, not measured in this run" not in text

def test_rendering_depends_on_the_results_only():
    assert rendered() == rendered()


def page_checks() -> list[Callable[[Path], None]]:
    """tests/test_docs.py's checks of one page (its tests that take a ``page``)."""
    return [check for name, check in vars(test_docs).items()
            if name.startswith("test_") and callable(check) and list(inspect.signature(check).parameters) == ["page"]]


def test_the_docs_checks_pass_on_a_generated_page(tmp_path: Path):
    """The generated page in docs/'s place, beside the other pages: every check tests/test_docs.py
    makes of a single page passes on it, and the headings other pages link to are there."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for other in (ROOT / "docs").iterdir():
        if other.name != "benchmarks.md":
            (docs / other.name).symlink_to(other)
    generated = docs / "benchmarks.md"
    generated.write_text(rendered(), encoding="utf-8")
    checks = page_checks()
    assert test_docs.test_every_relative_link_and_anchor_resolves in checks
    for check in checks:
        check(generated)
    assert set(ANCHORS) <= test_docs.anchors(generated)
    assert "cron_celery.W001" in generated.read_text(encoding="utf-8")  # the check stays documented


def test_the_checked_in_page_keeps_the_linked_anchors():
    assert set(ANCHORS) <= test_docs.anchors(ROOT / "docs" / "benchmarks.md")


# -------------------------------------------------------------------- missing results


def test_a_missing_benchmark_result_is_a_clear_error(results_dir: Path):
    (results_dir / "locks.json").unlink()
    assert page.missing(results_dir) == ["locks"]
    with pytest.raises(figures.ResultError, match=r"no results for locks in .*--only locks --results"):
        page.load(results_dir)


def test_a_directory_without_a_manifest_is_not_a_results_directory(tmp_path: Path):
    with pytest.raises(figures.ResultError, match=r"manifest\.json"):
        page.load(tmp_path)


def test_an_older_results_file_is_named_with_the_key_it_lacks(results_dir: Path):
    edit(results_dir, "history.json", lambda data: data.pop("settings"))
    with pytest.raises(figures.ResultError, match=r"history.json has no settings"):
        rendered(results_dir)


# ---------------------------------------------------------------------- the command


def test_the_runner_and_the_page_know_the_same_benchmarks():
    assert run.NAMES == figures.NAMES
    assert all((ROOT / benchmark.script).exists() for benchmark in run.BENCHMARKS)


def fake_benchmarks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str = "") -> None:
    """Stand-ins for the four scripts: each copies its fixture JSON to ``--json`` (or fails)."""
    stand_ins = []
    for benchmark in run.BENCHMARKS:
        script = tmp_path / f"fake_{benchmark.name}.py"
        if benchmark.name == failing:
            script.write_text("import sys\nprint('benchmark failed: on purpose')\nsys.exit(3)\n")
        else:
            script.write_text(
                "import shutil, sys\n"
                f"shutil.copy({str(FIXTURE / f'{benchmark.name}.json')!r}, sys.argv[sys.argv.index('--json') + 1])\n"
            )
        stand_ins.append(run.Benchmark(benchmark.name, str(script), benchmark.full, benchmark.quick))
    monkeypatch.setattr(run, "BENCHMARKS", tuple(stand_ins))


def test_the_command_runs_each_benchmark_then_writes_the_page(tmp_path, monkeypatch):
    fake_benchmarks(tmp_path, monkeypatch)
    out = tmp_path / "benchmarks.md"
    assert run.main(["--quick", "--results", str(tmp_path / "r"), "--out", str(out)]) == 0
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert list(manifest["benchmarks"]) == list(figures.NAMES)
    assert manifest["runs"][0]["quick"] is True
    assert manifest["benchmarks"]["locks"]["options"] == list(run.BENCHMARKS[1].quick)
    text = out.read_text()
    assert "**Quick run.**" in text and "--quick --results" in text
    assert (tmp_path / "r" / "overhead.log").exists()
    # rendering again from the same results gives the same page
    again = tmp_path / "again.md"
    assert run.main(["--from-results", str(tmp_path / "r"), "--out", str(again)]) == 0
    assert again.read_text() == text


def test_a_failed_benchmark_fails_the_command_and_leaves_the_page(tmp_path, monkeypatch):
    fake_benchmarks(tmp_path, monkeypatch, failing="beat_scale")
    out = tmp_path / "benchmarks.md"
    out.write_text("the page as it was\n")
    with pytest.raises(BenchError, match=r"fake_beat_scale\.py failed with exit status 3"):
        run.main(["--results", str(tmp_path / "r"), "--out", str(out)])
    assert out.read_text() == "the page as it was\n"
    assert "on purpose" in (tmp_path / "r" / "beat_scale.log").read_text()


def test_a_partial_run_keeps_its_results_and_does_not_write_the_page(tmp_path, monkeypatch):
    fake_benchmarks(tmp_path, monkeypatch)
    out = tmp_path / "benchmarks.md"
    assert run.main(["--only", "locks", "--results", str(tmp_path / "r"), "--out", str(out)]) == 0
    assert not out.exists()
    assert run.main(["--only", "overhead,beat_scale,latency,history,memory", "--results", str(tmp_path / "r"),
                     "--out", str(out)]) == 0
    assert out.exists()
    assert len(json.loads((tmp_path / "r" / "manifest.json").read_text())["runs"]) == 2


def test_from_results_with_a_missing_result_leaves_the_page(results_dir: Path, tmp_path: Path):
    (results_dir / "history.json").unlink()
    out = tmp_path / "benchmarks.md"
    out.write_text("unchanged\n")
    with pytest.raises(figures.ResultError, match="history"):
        run.main(["--from-results", str(results_dir), "--out", str(out)])
    assert out.read_text() == "unchanged\n"


def test_only_names_known_benchmarks(capsys):
    with pytest.raises(SystemExit):
        run.main(["--only", "overhead,nope"])
    assert "choose from" in capsys.readouterr().err



def test_the_metrics_scrape_at_each_history_size_against_the_smallest(results_dir):
    text = "\n".join(sections.history_section(page.load(results_dir)))
    assert "### The metrics scrape as history grows" in text
    assert "| 20,000 | 4 | 20.00 ms | 25.00 ms | 1.00 | 0 |" in text
    assert "| 40,000 | 4 | 22.00 ms | 26.00 ms | 1.10 | 0 |" in text
    edit(results_dir, "history.json", lambda data: data.pop("scrapes"))  # results from before the scrapes
    assert "metrics scrape as history grows" not in "\n".join(sections.history_section(page.load(results_dir)))


def test_the_dashboard_figures_from_the_rollups_beside_the_week_scans(results_dir):
    text = "\n".join(sections.history_section(page.load(results_dir)))
    assert "plus a job\nthat ran every second for a week (604,800 executions, 5-50 ms each, 1 % failed;" in text
    assert "| from the rollups (the page now) | 8.00 ms | 1 |" in text
    assert "| scanning each job's week (the page before) | 400.0 ms | 50.0 |" in text
    assert "from the rollups 598,752 of 604,800 succeeded, median 27.6 ms\n" in text
    assert "from its executions 598,752 of 604,800 succeeded, median 28.0 ms." in text
    edit(results_dir, "history.json", lambda data: data.pop("figures"))  # results from before the rollups
    assert "before and after the rollups" not in "\n".join(sections.history_section(page.load(results_dir)))


def test_the_beat_benchmark_takes_sizes_up_to_a_million_and_names_its_variants(capsys):
    from bench import beat_scale

    assert beat_scale.parse_sizes("10,100_000") == (10, 100_000)
    with pytest.raises(argparse.ArgumentTypeError, match=r"sizes are 1\.\.999999"):
        beat_scale.parse_sizes("1000000")
    with pytest.raises(SystemExit):
        beat_scale.main(["--variants", "cron_celery,nonesuch"])
    assert "--variants takes some of dbs, cron_celery, cron_celery_jitter, cron_celery_after, not " \
           "'cron_celery,nonesuch'" in capsys.readouterr().err


def test_importing_the_benchmarks_leaves_the_environment_alone():
    """Each script sets what its processes need (settings module, queue, always-lead) in ``main``: a
    test that imports one must not hand ``CRON_CELERY_BEAT_ALWAYS_LEAD`` to the beats that later
    tests start (it made every beat lead at once, and six leadership tests failed)."""
    probe = ("import os\nbefore = dict(os.environ)\n"
             "import bench.beat_scale, bench.memory, bench.latency, bench.history, bench.locks, bench.run\n"
             "print(sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
