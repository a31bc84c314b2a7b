"""What a job lock costs: one acquire + release, from the raw Redis commands up to cron_celery.

Variants (``bench/locks_variants.py``), each timed per iteration from building the lock object to
the end of its release:

  raw          ``SET key token NX PX ttl``, then a compare-and-delete Lua script (``GET`` =
               token, then ``DEL``; sent with ``EVALSHA``) with redis-py, one master: the floor;
  raw x3       the same against three masters one after the other (reference only);
  redis-py     ``client.lock(name, timeout=ttl)``: ``acquire(blocking=False)``, ``release()``;
  pottery      ``Redlock(key=..., masters=..., auto_release_time=ttl,
               raise_on_redis_errors=True)``: ``acquire(blocking=False)``, ``release()``,
               with one and with three masters;
  cron_celery  ``cron_celery.run.locks.JobLock(code).acquire()`` and ``.release()``, with one and
               with three masters, configured through ``settings.CRON_CELERY["LOCK"]``.

Every iteration uses a key of its own, so no variant ever waits for another. The masters
are ``redis-server`` processes started here on free ports (``--save "" --appendonly no``)
and stopped in a ``finally``; the machine's own Redis is never contacted.

Each repeat runs a warm-up per variant, then the timed iterations in chunks, the variants
taking turns chunk by chunk (the order rotating each repeat) so that load from elsewhere on
the machine falls on all of them alike. Reported: the median of the repeats' medians and of
their 99th percentiles, the ratio of each median to the floor's, and cron_celery's median
over pottery's with the same masters (target: at most 1.1).

Usage, from the repository root::

    ./.venv-dj52/bin/python bench/locks.py              # 2000 iterations, 200 warm-up, 3 repeats
    ./.venv-dj52/bin/python bench/locks.py --quick      # 200 iterations, 20 warm-up, 1 repeat
    ./.venv-dj52/bin/python bench/locks.py --profile    # also cProfile pottery vs cron_celery
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import gc
import io
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``cron_celery`` importable
    sys.path.insert(0, str(ROOT))

from bench.common import log, log_machine, run, stop_on_sigterm, write_results  # noqa: E402
from bench.locks_variants import TTL, Variant, build_variants, close_variants  # noqa: E402
from bench.redis_server import RedisServer  # noqa: E402

#: Each cron_celery variant and the pottery variant with the same masters: the target's pairs.
PAIRS = {"cron1": "pottery1", "cron3": "pottery3"}


# ------------------------------------------------------------------------------ timing


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def run_chunk(variant: Variant, start: int, count: int) -> list[float]:
    """``count`` timed iterations; microseconds each."""
    clock = time.perf_counter_ns
    one = variant.one
    samples = []
    with variant.active():
        for i in range(start, start + count):
            t0 = clock()
            one(i)
            samples.append((clock() - t0) / 1000)
    return samples


def run_repeat(variants: list[Variant], *, rep: int, iterations: int, warmup: int,
               chunk: int) -> dict[str, list[float]]:
    """One repeat: warm-up per variant, then the variants take turns, ``chunk`` at a time."""
    shift = (rep - 1) % len(variants)
    order = variants[shift:] + variants[:shift]
    samples: dict[str, list[float]] = {v.key: [] for v in variants}
    base = rep * 10_000_000  # keys never repeat across repeats
    for variant in order:
        run_chunk(variant, base, warmup)
    done = 0
    while done < iterations:
        count = min(chunk, iterations - done)
        for variant in order:
            gc.collect()
            samples[variant.key].extend(run_chunk(variant, base + warmup + done, count))
        done += count
    return samples


def profile(variants: list[Variant], keys: tuple[str, ...], iterations: int, top: int) -> dict[str, str]:
    """cProfile ``iterations`` of each named variant; returns the printed statistics."""
    reports = {}
    for variant in (v for v in variants if v.key in keys):
        run_chunk(variant, 90_000_000, 50)
        profiler = cProfile.Profile()
        with variant.active():
            profiler.enable()
            for i in range(iterations):
                variant.one(91_000_000 + i)
            profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("cumulative")
        stats.print_stats(top)
        reports[variant.key] = out.getvalue()
    return reports


# -------------------------------------------------------------------------------- main


def configure_django() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=[], USE_TZ=True, TIME_ZONE="UTC", SECRET_KEY="bench-only-not-secret",
            # Replaced by override_settings for each cron_celery variant.
            CRON_CELERY={"LOCK": {"MASTERS": [], "TTL": TTL}},
            LOGGING_CONFIG=None,
        )
    django.setup()


def versions() -> dict[str, str]:
    from importlib import metadata

    import django

    return {"python": platform.python_version(), "django": django.get_version(),
            "redis_py": redis.__version__, "pottery": metadata.version("pottery")}


def fmt(value: float) -> str:
    return f"{value:9.0f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, with ``iterations``, ``warmup`` and ``repeat`` resolved (``--quick`` or the defaults)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=None,
                        help="timed iterations per variant and repeat (default 2000)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="warm-up iterations per variant and repeat (default 200)")
    parser.add_argument("--repeat", type=int, default=None, help="repeats (default 3)")
    parser.add_argument("--chunk", type=int, default=100,
                        help="iterations a variant runs before the next takes its turn (default 100)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 200 iterations, 20 warm-up, 1 repeat (unless given)")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile pottery and cron_celery (1 and 3 masters) and print the top")
    parser.add_argument("--profile-iterations", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=None,
                        help="write the results here (default bench/results/locks-<time>.json)")
    args = parser.parse_args(argv)
    args.iterations = args.iterations or (200 if args.quick else 2000)
    args.warmup = args.warmup if args.warmup is not None else (20 if args.quick else 200)
    args.repeat = args.repeat or (1 if args.quick else 3)
    if args.iterations < 100:
        parser.error("--iterations must be at least 100 (for a 99th percentile)")
    if args.chunk < 1:
        parser.error("--chunk must be at least 1")
    return args


def describe_run(args: argparse.Namespace, servers: list[RedisServer], started_at: dt.datetime) -> dict[str, Any]:
    """The run's settings, as the results file records them; logged as the output's first lines."""
    header: dict[str, Any] = {
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "iterations": args.iterations, "warmup": args.warmup, "repeat": args.repeat, "chunk": args.chunk,
        "ttl_seconds": TTL, "masters": [server.url for server in servers], "redis_server": servers[0].version(),
        "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), **versions(),
    }
    log(f"cron_celery lock benchmark, {header['date']}")
    log(f"  {args.iterations} timed iterations per variant and repeat after {args.warmup} warm-up, "
        f"{args.repeat} repeat(s), variants interleaved in chunks of {args.chunk}")
    log(f"  masters: redis-server {header['redis_server']} x3 on 127.0.0.1 ports "
        f"{', '.join(str(s.port) for s in servers)} (--save '' --appendonly no); "
        f"TTL {TTL}s; a new key every iteration")
    log(f"  Python {header['python']}, Django {header['django']}, redis-py "
        f"{header['redis_py']}, pottery {header['pottery']}")
    log_machine(header["cpus"], header["loadavg_start"][0], "high and noisy")
    log("")
    return header


def time_repeats(variants: list[Variant], args: argparse.Namespace,
                 header: dict[str, Any]) -> dict[str, list[dict[str, float]]]:
    """Every repeat's figures per variant (microseconds); each repeat's load average goes to ``header``."""
    per_repeat: dict[str, list[dict[str, float]]] = {v.key: [] for v in variants}
    header["loadavg_per_repeat"] = []
    for rep in range(1, args.repeat + 1):
        t0 = time.perf_counter()
        samples = run_repeat(variants, rep=rep, iterations=args.iterations, warmup=args.warmup,
                             chunk=args.chunk)
        for variant in variants:
            timed = samples[variant.key]
            per_repeat[variant.key].append({
                "median": statistics.median(timed), "p99": p99(timed),
                "mean": statistics.fmean(timed), "min": min(timed), "max": max(timed),
            })
        header["loadavg_per_repeat"].append(os.getloadavg())
        cells = "  ".join(f"{v.key} {per_repeat[v.key][-1]['median']:.0f}" for v in variants)
        log(f"repeat {rep}/{args.repeat} ({time.perf_counter() - t0:.1f}s, load "
            f"{os.getloadavg()[0]:.2f}), medians in µs: {cells}")
    return per_repeat


def summarize(per_repeat: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Per variant: the median of the repeats' medians and of their p99s, the median over the
    floor's, and for cron_celery over pottery's with the same masters (overall and per repeat)."""
    summary: dict[str, dict[str, Any]] = {
        key: {"median_us": statistics.median(r["median"] for r in runs),
              "p99_us": statistics.median(r["p99"] for r in runs)}
        for key, runs in per_repeat.items()
    }
    floor = summary["raw"]["median_us"]
    for key, values in summary.items():
        values["x_floor"] = values["median_us"] / floor
        if key in PAIRS:
            values["x_pottery"] = values["median_us"] / summary[PAIRS[key]]["median_us"]
            values["x_pottery_per_repeat"] = [
                mine["median"] / theirs["median"]
                for mine, theirs in zip(per_repeat[key], per_repeat[PAIRS[key]], strict=True)
            ]
    return summary


def log_summary(variants: list[Variant], summary: dict[str, dict[str, Any]], load_end: float) -> bool:
    """The table of the variants and the ratios against pottery; returns whether the target was met."""
    log("")
    log(f"{'variant':<48}{'masters':>8}{'median µs':>11}{'p99 µs':>9}{'x floor':>9}{'/ pottery':>11}")
    for variant in variants:
        values = summary[variant.key]
        label = variant.label + (" (floor)" if variant.floor else "")
        ratio = f"{values['x_pottery']:11.2f}" if "x_pottery" in values else ""
        log(f"{label:<48}{variant.masters:>8}{values['median_us']:>11.0f}{values['p99_us']:>9.0f}"
            f"{values['x_floor']:>9.2f}{ratio}")
    log("")
    target_met = all(summary[key]["x_pottery"] <= 1.1 for key in PAIRS)
    for key in PAIRS:
        per = ", ".join(f"{r:.2f}" for r in summary[key]["x_pottery_per_repeat"])
        log(f"cron_celery / pottery, {key[-1]} master(s): {summary[key]['x_pottery']:.2f}  "
            f"(per repeat: {per})")
    log(f"target cron_celery <= 1.1 x pottery: {'met' if target_met else 'NOT met'}")
    log(f"load average at the end {load_end:.2f}")
    return target_met


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_sigterm()  # a SIGTERM must still stop the servers
    configure_django()

    started_at = dt.datetime.now(dt.UTC)
    servers: list[RedisServer] = []
    variants: list[Variant] = []
    with tempfile.TemporaryDirectory(prefix="cron-celery-bench-locks-") as tmp:
        try:
            for _ in range(3):
                servers.append(RedisServer(Path(tmp)).start())
            header = describe_run(args, servers, started_at)
            variants = build_variants(header["masters"])
            per_repeat = time_repeats(variants, args, header)
            reports = profile(variants, ("pottery1", "cron1", "pottery3", "cron3"),
                              args.profile_iterations, 25) if args.profile else {}
            header["loadavg_end"] = os.getloadavg()
        finally:
            with contextlib.suppress(Exception):
                close_variants(variants)
            for server in servers:
                server.stop()

    summary = summarize(per_repeat)
    target_met = log_summary(variants, summary, header["loadavg_end"][0])
    for key, text in reports.items():
        log(f"\ncProfile, {args.profile_iterations} iterations of {key} (cumulative):\n{text}")

    write_results("locks", started_at, {
        "settings": header,
        "variants": {v.key: {"label": v.label, "masters": v.masters, "floor": v.floor,
                             "reference_only": v.reference_only} for v in variants},
        "per_repeat": per_repeat, "summary": summary, "target_met": target_met,
    }, args.json)
    return 0


if __name__ == "__main__":
    run(main)
