"""Runs the benchmarks one after the other, then writes docs/benchmarks.md from their results.

    ./scripts/bench                                  # everything, full size (about an hour; longer the first time)
    ./scripts/bench --quick                          # small sizes: a few minutes, to check the pipeline
    ./scripts/bench --only locks --results DIR       # run one again into an earlier run's results
    ./scripts/bench --from-results DIR               # render the page only, from existing results

Each benchmark runs as a subprocess (``bench/<name>.py ... --json DIR/<name>.json``) with
its output shown and kept in ``DIR/<name>.log``. ``DIR/manifest.json`` records the machine,
the commit, the command and what each benchmark was run with. The page is written only when
every benchmark has succeeded and every result is in ``DIR``; a failure leaves it untouched
and ends the command with a non-zero status.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import page
from bench.common import ROOT, BenchError, log, run, stop_on_sigterm

#: Databases the benchmarks must never use: the test suite's and the demo's.
FORBIDDEN_DATABASES = ("cron_celery", "cron_celery_demo")


@dataclasses.dataclass(frozen=True)
class Benchmark:
    name: str  # also the name of its results file, NAME.json
    script: str  # relative to the repository's root
    full: tuple[str, ...]  # the script's options for the published figures
    quick: tuple[str, ...]  # ... and for a quick run


#: In the page's order. Quick runs keep two repeats where one noisy moment would otherwise
#: decide a ratio, and measure the beat at one size only (each size waits for two minute
#: boundaries).
BENCHMARKS = (
    Benchmark("overhead", "bench/overhead.py",
              ("--also-without-reuse", "--also-commit-off", "--profile", "docs/img/tracked-run-flame.svg"),
              ("--n", "500", "--repeat", "2", "--also-without-reuse", "--also-commit-off")),
    Benchmark("locks", "bench/locks.py", (), ("--iterations", "500", "--warmup", "50", "--repeat", "3")),
    Benchmark("beat_scale", "bench/beat_scale.py", ("--sizes", "10,1000,10000,100000", "--alone-from", "100000"),
              ("--sizes", "1000", "--burst-cap", "30")),
    Benchmark("latency", "bench/latency.py", ("--sizes", "100,1000,10000", "--minutes", "1"),
              ("--sizes", "100", "--minutes", "1", "--drain-cap", "30")),
    Benchmark("history", "bench/history.py", (), ("--rows", "20000", "--jobs", "50", "--repeat", "3",
                                                 "--scrape-rows", "20000,40000")),
    Benchmark("memory", "bench/memory.py", (), ("--quick",)),
)
NAMES = tuple(benchmark.name for benchmark in BENCHMARKS)


# ----------------------------------------------------------------------------- machine


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware"):
            return value.strip()
    return ""


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "memory_gib": memory_gib(),
            "loadavg": list(os.getloadavg())}


def git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def commit() -> dict[str, Any]:
    """The checked-out commit, and whether the code that is measured differs from it."""
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "cron_celery", "bench", "pyproject.toml")
    return {"commit": git("rev-parse", "--short=10", "HEAD") or "unknown", "dirty": bool(changed)}


# ---------------------------------------------------------------------------- manifest


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / page.MANIFEST
    if not path.exists():
        return {"runs": [], "benchmarks": {}}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    path = directory / page.MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------- runs


def run_benchmark(benchmark: Benchmark, options: tuple[str, ...], directory: Path) -> float:
    """Run one benchmark's script to completion; returns its wall time in seconds."""
    result = directory / f"{benchmark.name}.json"
    # Written beside the result and moved over it only on success: a failed re-run keeps the
    # earlier result, and a stale file never passes for this run's.
    fresh = directory / f"{benchmark.name}.json.new"
    fresh.unlink(missing_ok=True)
    cmd = [sys.executable, benchmark.script, *options, "--json", str(fresh)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log(f"\n== {benchmark.name}: {shlex.join([benchmark.script, *options])}")
    started = time.monotonic()
    with open(directory / f"{benchmark.name}.log", "w", encoding="utf-8") as out:
        # A session of its own: Ctrl-C reaches this process only, which then asks the
        # benchmark to stop exactly once (a second signal would cut its clean-up short).
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, bufsize=1, start_new_session=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                out.write(line)
            status = proc.wait()
        except BaseException:
            stop(proc)
            raise
    seconds = time.monotonic() - started
    if status != 0:
        raise BenchError(f"{benchmark.script} failed with exit status {status} "
                         f"(its output: {directory / f'{benchmark.name}.log'})")
    if not fresh.exists():
        raise BenchError(f"{benchmark.script} ended without writing {fresh}")
    fresh.replace(result)
    log(f"== {benchmark.name} done in {seconds:.0f} s")
    return seconds


def stop(proc: subprocess.Popen[str]) -> None:
    """Let an interrupted benchmark clean up: one SIGTERM (each script turns it into its own
    orderly stop), two minutes to finish, then SIGKILL for what is left of its group."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def check_databases() -> None:
    for variable in ("BENCH_DB", "BENCH_HISTORY_DB"):
        if os.environ.get(variable, "") in FORBIDDEN_DATABASES:
            raise BenchError(f"{variable}={os.environ[variable]} is not a benchmark database")


def write_page(directory: Path, out: Path) -> None:
    text = page.render(page.load(directory))
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(out)
    log(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


def parse_only(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(NAMES)} (got {text!r})")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=os.environ.get("BENCH_COMMAND", "python -m bench"),
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes and fewer repeats: a few minutes, to check the pipeline (the page says so)")
    parser.add_argument("--only", type=parse_only, default=None,
                        help=f"comma-separated benchmarks to run ({', '.join(NAMES)}); the page is written "
                             "only once the results directory holds all of them")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md",
                        help="the page to write (default docs/benchmarks.md)")
    parser.add_argument("--results", type=Path, default=None,
                        help="results directory to run into (default bench/results/run-<time>/; "
                             "an existing one keeps the results of benchmarks not run again)")
    parser.add_argument("--from-results", type=Path, default=None, metavar="DIR",
                        help="run nothing: render the page from the results in DIR")
    args = parser.parse_args(argv)
    raw_argv = sys.argv[1:] if argv is None else argv
    command = " ".join([os.environ.get("BENCH_COMMAND", "python -m bench"), shlex.join(raw_argv)]).strip()

    if args.from_results is not None:
        if args.quick or args.only or args.results:
            parser.error("--from-results renders only: it takes no --quick, --only or --results")
        write_page(args.from_results, args.out)
        return 0

    check_databases()
    started_at = dt.datetime.now(dt.UTC)
    directory = args.results or ROOT / "bench" / "results" / f"run-{started_at:%Y%m%d-%H%M%S}"
    directory.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(directory)
    run_index = len(manifest["runs"])
    manifest["runs"].append({"started_at": started_at.isoformat(timespec="seconds"), "command": command,
                             "quick": args.quick, **commit(), "machine": machine()})
    write_manifest(directory, manifest)
    chosen = [b for b in BENCHMARKS if args.only is None or b.name in args.only]
    log(f"benchmarks: {', '.join(b.name for b in chosen)}{' (quick)' if args.quick else ''}; "
        f"results in {directory}")

    for benchmark in chosen:
        options = benchmark.quick if args.quick else benchmark.full
        begun = dt.datetime.now(dt.UTC)
        loadavg = list(os.getloadavg())
        seconds = run_benchmark(benchmark, options, directory)
        manifest["benchmarks"][benchmark.name] = {
            "file": f"{benchmark.name}.json", "run": run_index, "script": benchmark.script,
            "options": list(options), "quick": args.quick,
            "started_at": begun.isoformat(timespec="seconds"), "seconds": round(seconds, 1),
            "loadavg_start": loadavg,
        }
        write_manifest(directory, manifest)

    total = (dt.datetime.now(dt.UTC) - started_at).total_seconds()
    manifest["runs"][run_index]["seconds"] = round(total, 1)
    write_manifest(directory, manifest)
    log(f"\nall benchmarks done in {total / 60:.1f} min")
    missing = page.missing(directory)
    if missing:
        log(f"the page was not written: {directory} has no results for {', '.join(missing)} yet "
            f"(run them with --results {directory}, or render later with --from-results {directory})")
        return 0
    write_page(directory, args.out)
    return 0


def entry() -> None:
    """``python -m bench``: a failure, Ctrl-C or SIGTERM ends with a message and a non-zero status."""
    stop_on_sigterm()
    run(main, what="bench", after="; the page was not written")
