"""One scheduler measured at one size, phase after phase inside the minutes they need, and the table
that sets cron_celery's figures beside DatabaseScheduler's."""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import redis

from bench.beat_scale_phases import (
    analyze_tables,
    burst_phase,
    edit_phase,
    idle_phase,
    pages_phase,
    sync_phase,
    timed_build,
)
from bench.beat_scale_stores import reset_tables
from bench.beat_scale_tallies import LogTally, PublishLog, next_boundary, resident, utc
from bench.beat_scale_variants import CronCeleryVariant, Variant
from bench.common import BenchError, log


def window_needed(restart_s: float, n: int) -> float:
    """Seconds to leave before the minute for a rebuild, the idle ticks and the edits."""
    return min(55.0, 4 + restart_s * 1.5 + 6 + 3 * restart_s + n / 2000)


def measure(variant: Variant, client: redis.Redis, publishes: PublishLog, logs: LogTally,
            args: argparse.Namespace) -> dict[str, Any]:
    n = variant.n
    reset_tables()
    memory: dict[str, float | None] = {"before_mib": resident()}
    started = time.perf_counter()
    variant.prepare()
    result: dict[str, Any] = {"scheduler": variant.label, "n": n,
                              "prepare_s": time.perf_counter() - started, "memory": memory}
    if isinstance(variant, CronCeleryVariant):
        result["declare_s"] = variant.declare_seconds
    memory["declared_mib"] = resident()
    logs.take()

    scheduler, result["build_first"] = timed_build(variant, logs)
    memory["built_mib"] = resident()  # the scheduler still open, its schedule read
    variant.close(scheduler)
    scheduler, result["build_restart"] = timed_build(variant, logs)
    variant.close(scheduler)
    restart_s = result["build_restart"]["seconds"]
    log(f"  {variant.label:<18} N={n:<6} build first {result['build_first']['seconds']:.3f} s, "
        f"restart {restart_s:.3f} s")

    # A rebuild, the idle ticks and the edits must all fit before the next minute.
    need = window_needed(restart_s, n)
    if next_boundary() - time.time() < need:
        time.sleep(max(0.0, next_boundary() - time.time()) + 0.2)
    for _attempt in range(3):
        boundary = next_boundary()
        variant.arm(boundary)
        scheduler, result["build_armed"] = timed_build(variant, logs)
        try:
            edit_reserve = max(3.0, need - 6 - restart_s * 1.5)
            result["idle"] = idle_phase(scheduler, args.idle_ticks, boundary - edit_reserve)
            result["edit"] = edit_phase(variant, scheduler)
            result["edit"]["log_records"] = logs.take()
            if time.time() < boundary - 0.5:
                break
            log("    the minute came before the edits were done: measuring again at the next one")
        except BaseException:
            variant.close(scheduler)
            raise
        variant.close(scheduler)
        time.sleep(max(0.0, next_boundary() - time.time()) + 0.2)
    else:
        raise BenchError("could not fit the idle ticks and the edits inside a minute")

    try:
        idle, edit = result["idle"], result["edit"]
        log(f"  {'':<18} {'':<8} idle tick median {idle['median_ms']:.2f} ms ({idle['ticks']} ticks), "
            f"edit picked up in {edit['single']['ms']:.1f} ms ({edit['single']['rows_read']} rows read); "
            f"waiting for {utc(boundary):%H:%M:%S}")
        result["burst"] = burst_phase(variant, scheduler, publishes, client, boundary, args.burst_cap)
        result["burst"]["log_records"] = logs.take()
        memory["burst_mib"] = resident()
    finally:
        variant.close(scheduler)
    burst = result["burst"]
    log(f"  {'':<18} {'':<8} burst: {burst['published']}/{n} published, last "
        f"{burst['last_s']:.2f} s after the slot, {burst['rate_per_s']:.1f}/s")
    before = memory["before_mib"]
    log(f"  {'':<18} {'':<8} resident memory {before} MiB before the jobs, {memory['declared_mib']} declared, "
        f"{memory['built_mib']} built, {memory['burst_mib']} after the burst")
    if variant.key == "cron_celery":  # the command and the pages, with the burst's executions in place
        result["sync_command"] = sync_phase()
        analyze_tables()
        sync = result["sync_command"]
        log(f"  {'':<18} {'':<8} sync_cron_schedules {sync['seconds']:.3f} s, {sync['statements']:,} statements, "
            f"{sync['rows_read']:,} rows read ({sync['report']})")
        job_id = variant.edit_target_job_id()
        result["pages"] = pages_phase(job_id)
        for page in result["pages"].values():
            log(f"  {'':<18} {'':<8} {page['page']:<28} {page['median_ms']:9.2f} ms median, "
                f"{page['statements']:3} statements, {page['rows_read']:,} rows read")
    return result


# ------------------------------------------------------------------------------ report


def ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or not theirs or math.isnan(ours) or math.isnan(theirs):
        return "-"
    return f"{ours / theirs:.3g}"


def burst_time(burst: dict[str, Any]) -> str:
    value = burst["time_to_all_s"]
    if value is None:
        return "-"
    return f"{value:.2f} s" if burst["complete"] else f"~{value:.0f} s (extrap.)"


def table(n: int, dbs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    def row(label: str, left: str, right: str, rat: str = "") -> str:
        return f"  {label:<36} {left:>24} {right:>24} {rat:>9}"

    rows = [f"N = {n:,}", row("", "DatabaseScheduler", ours["scheduler"], "cc / DBS"),
            row("jobs in place (bulk insert / declare)", f"{dbs['prepare_s']:.3f} s", f"{ours['prepare_s']:.3f} s")]
    for key, label in (("build_first", "build, first"), ("build_restart", "build, restart")):
        rows.append(row(label, f"{dbs[key]['seconds']:.3f} s", f"{ours[key]['seconds']:.3f} s",
                        ratio(ours[key]["seconds"], dbs[key]["seconds"])))
        rows.append(row("  SQL statements", f"{dbs[key]['statements']:,}", f"{ours[key]['statements']:,}"))
    idle_d, idle_o = dbs["idle"], ours["idle"]
    rows.append(row("idle tick, median", f"{idle_d['median_ms']:.2f} ms", f"{idle_o['median_ms']:.2f} ms",
                    ratio(idle_o["median_ms"], idle_d["median_ms"])))
    rows.append(row("idle tick, p95", f"{idle_d['p95_ms']:.2f} ms", f"{idle_o['p95_ms']:.2f} ms",
                    ratio(idle_o["p95_ms"], idle_d["p95_ms"])))
    rows.append(row("  statements / rows read per tick",
                    f"{idle_d['statements_per_tick']:.1f} / {idle_d['rows_read_per_tick']:.1f}",
                    f"{idle_o['statements_per_tick']:.1f} / {idle_o['rows_read_per_tick']:.1f}"))
    for key, label in (("single", "edit one job: pickup"), ("undo", "undo the edit: pickup"),
                       ("shared_row", "edit shared crontab row: pickup")):
        left, right = dbs["edit"][key], ours["edit"][key]
        rows.append(row(label, f"{left['ms']:.1f} ms in {left['ticks']} tick(s)",
                        f"{right['ms']:.1f} ms in {right['ticks']} tick(s)", ratio(right["ms"], left["ms"])))
        rows.append(row("  statements / rows read / written",
                        f"{left['statements']} / {left['rows_read']:,} / {left['rows_written']:,}",
                        f"{right['statements']} / {right['rows_read']:,} / {right['rows_written']:,}"))
    bd, bo = dbs["burst"], ours["burst"]
    rows.append(row("burst: published", f"{bd['published']:,}/{n:,}" + ("" if bd["complete"] else " (cap)"),
                    f"{bo['published']:,}/{n:,}" + ("" if bo["complete"] else " (cap)")))
    rows.append(row("burst: first publish after slot", f"{bd['first_s']:.3f} s", f"{bo['first_s']:.3f} s"))
    rows.append(row("burst: last publish after slot", f"{bd['last_s']:.3f} s", f"{bo['last_s']:.3f} s"))
    rows.append(row("burst: publishes/s (to the last)", f"{bd['rate_per_s']:.1f}", f"{bo['rate_per_s']:.1f}",
                    ratio(bo["rate_per_s"], bd["rate_per_s"])))
    rows.append(row("burst: time to publish all N", burst_time(bd), burst_time(bo),
                    ratio(bo["time_to_all_s"], bd["time_to_all_s"])))
    return rows
