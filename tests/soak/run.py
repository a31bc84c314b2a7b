"""``python -m tests.soak``: start the whole system, inject faults for ``--minutes``, heal,
wait for quiescence, check the history, print a report; exit 1 on any anomaly.

    python -m tests.soak --minutes 2 --seed 1
    python -m tests.soak --minutes 10 --seed 7 --faults kill-worker,broker,pg-restart --keep /tmp/soak
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.soak import history
from tests.soak import spec as specs
from tests.soak.cluster import DATABASE, Cluster
from tests.soak.nemesis import KINDS, Nemesis

logger = logging.getLogger("soak")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=2.0, help="how long the nemesis acts (default 2)")
    parser.add_argument("--seed", type=int, default=1, help="the nemesis' random seed (default 1)")
    parser.add_argument("--faults", default="all",
                        help=f"comma list of fault kinds, or 'all' or 'none': {', '.join(KINDS)}")
    parser.add_argument("--mean-gap", type=float, default=4.0, help="mean seconds between faults (default 4)")
    parser.add_argument("--workers", type=int, default=3, help="prefork workers (default 3)")
    parser.add_argument("--processes", type=int, default=4,
                        help="pool processes per worker (default 4: the jobs' bodies keep about half of them busy)")
    parser.add_argument("--quiesce", type=float, default=150.0,
                        help="most seconds to wait, after healing, for every execution to end (default 150)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the logs, the marker files and a dump of the database in this directory")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every fault as it happens")
    args = parser.parse_args(argv)
    if args.faults == "all":
        args.kinds = list(KINDS)
    elif args.faults == "none":
        args.kinds = []
    else:
        args.kinds = [kind.strip() for kind in args.faults.split(",") if kind.strip()]
        unknown = sorted(set(args.kinds) - set(KINDS))
        if unknown:
            parser.error(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(message)s",
                        stream=sys.stdout)
    began = time.monotonic()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="soak-", dir=args.keep))
    else:
        workdir = Path(tempfile.mkdtemp(prefix="cron-soak-"))
    os.chmod(workdir, 0o755)
    if "clock" in args.kinds:
        from tests.soak.tools import need_faketime

        need_faketime()
    cluster = Cluster(workdir, workers=args.workers, processes=args.processes)
    try:
        return soak(cluster, args, began)
    finally:
        with contextlib.suppress(Exception):
            if args.keep is not None and cluster.postgres.log.exists():
                shutil.copy(cluster.postgres.log, cluster.logs / "postgres.log")
        with contextlib.suppress(Exception):
            if args.keep is not None and cluster.postgres.running():
                cluster.postgres.dump(DATABASE, workdir / "database.dump")
                print(f"the soak's database is kept in {workdir / 'database.dump'} (pg_restore it to look)")
        cluster.close()
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs and markers kept in {workdir}")


def soak(cluster: Cluster, args: argparse.Namespace, began: float) -> int:
    print(f"soak: seed {args.seed}, {args.minutes:g} min, faults: {', '.join(args.kinds) or 'none'}", flush=True)
    cluster.window_for(args.minutes * 60)
    cluster.start_servers()
    os.environ.update({key: value for key, value in cluster.direct_env().items() if key.startswith("CRON_SOAK_")})
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.soak.settings"
    os.environ["CRON_SOAK_HARNESS"] = "1"  # only this process: its children get environments of their own
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    import tests.soak.celery_app  # the app the person's runs are sent with
    import tests.soak.tasks  # noqa: F401 - the jobs the person acts on
    from tests.soak.person import Person, make_tracked_task

    make_tracked_task()
    person = Person(cluster.markers, args.seed, until=time.time() + 150 + args.minutes * 60)
    cluster.make_services()
    for worker in cluster.workers:
        worker.start()
    deadline = time.monotonic() + 120
    while not all(worker.ready() for worker in cluster.workers):
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not become ready in 120 s")
        time.sleep(0.2)
    for beat in cluster.beats:
        beat.start()
        time.sleep(0.5)
    setup = time.monotonic() - began
    print(f"soak: set up in {setup:.0f} s; the nemesis acts for {args.minutes * 60:.0f} s", flush=True)
    nemesis = Nemesis(cluster, args.seed, args.kinds, mean_gap=args.mean_gap, editor=person)
    person.until = time.time() + args.minutes * 60
    end = time.monotonic() + args.minutes * 60
    while time.monotonic() < end:
        nemesis.step(injecting=bool(args.kinds))
        person.step(nemesis.later)
        person.watch(nemesis.later)
        time.sleep(0.1)
    healing = time.monotonic()
    heal(cluster, nemesis)
    for beat in cluster.beats:  # no new slots from here on
        beat.retired = True
        beat.terminate()
    unschedule()
    quiet, waited = quiesce(cluster, nemesis, args.quiesce)
    for worker in cluster.workers:
        worker.retired = True
        worker.terminate()
    print(f"soak: healed and quiet after {waited:.0f} s{'' if quiet else ' (NOT quiet: the bound ran out)'}",
          flush=True)
    report = check(cluster, nemesis, person.counts)
    total = time.monotonic() - began
    print(f"soak: wall time {total:.0f} s (setup {setup:.0f} s, faults {healing - began - setup:.0f} s, "
          f"quiescence {waited:.0f} s)")
    return report


def heal(cluster: Cluster, nemesis: Nemesis) -> None:
    nemesis.heal_all()
    if not cluster.postgres.running():
        cluster.postgres.start()
    for server in (cluster.broker, *cluster.locks):
        if server.proc is None or server.proc.poll() is not None:
            server.start()
    for proxy in [*cluster.db_proxies, *(p for group in cluster.redis_proxies for p in group)]:
        proxy.heal()


def unschedule() -> None:
    """The beats are gone for good: take every job's next slot away, so that the reconciler does not
    go on recording MISSED slots (and alerting them) while the soak waits for quiescence."""
    from django.db import DatabaseError, connection

    for _ in range(20):
        try:
            with connection.cursor() as cursor:
                cursor.execute("UPDATE cron_celery_cronjob SET next_run_at = NULL")
            return
        except DatabaseError:
            connection.close()
            time.sleep(0.5)
    raise RuntimeError("could not reach the database to end the schedules")


def open_counts() -> tuple[int, int]:
    """(executions not ended, alerts not delivered)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cron_celery_cronexecution"
                       " WHERE status IN ('PENDING', 'RUNNING', 'RETRYING')")
        executions = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM cron_celery_alert WHERE status = 'PENDING'")
        alerts = cursor.fetchone()[0]
    return int(executions), int(alerts)


def quiesce(cluster: Cluster, nemesis: Nemesis, bound: float) -> tuple[bool, float]:
    """Wait until no execution is open and no alert undelivered, twice in a row a second apart."""
    from django.db import DatabaseError, connection

    began = time.monotonic()
    quiet_since: float | None = None
    while time.monotonic() - began < bound:
        nemesis.supervise()
        try:
            executions, alerts = open_counts()
        except DatabaseError:
            connection.close()
            executions, alerts = -1, -1
        if executions == 0 and alerts == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= 2:
                return True, time.monotonic() - began
        else:
            quiet_since = None
            if int(time.monotonic() - began) % 10 == 0:
                logger.info("soak: waiting for %s open executions and %s undelivered alerts", executions, alerts)
        time.sleep(0.5)
    return False, time.monotonic() - began


def start_lag(rows: list[history.Row]) -> str:
    """How late the beat's slots started (slot to first start), for a person to see whether the
    workers kept up: a cluster that cannot run its jobs' bodies as fast as they come due builds a
    backlog that no fault explains (and that quiescence cannot drain)."""
    lags = sorted((row.started - row.slot).total_seconds() for row in rows
                  if row.trigger == "BEAT" and row.started is not None)
    if not lags:
        return "start lag of beat slots: none started"

    def at(share: float) -> float:
        return lags[min(len(lags) - 1, int(share * len(lags)))]

    return (f"start lag of beat slots (slot to first start): median {at(0.5):.1f} s, p99 {at(0.99):.1f} s, "
            f"max {lags[-1]:.1f} s")


def check(cluster: Cluster, nemesis: Nemesis, person_counts: dict[str, int]) -> int:
    from django.conf import settings
    from django.db import connection

    from tests.soak import checker

    connection.close()
    with connection.cursor() as cursor:
        rows = history.load_rows(cursor)
        alerts = history.load_alerts(cursor)
        jobs = history.load_jobs(cursor)
        pause_ends = history.load_pause_ends(cursor)
    faults = [(fault.kind, fault.started, fault.ended or fault.started) for fault in nemesis.faults]
    with open(cluster.workdir / "executions.jsonl", "w", encoding="utf-8") as dump:  # for a person to read
        for row in rows:
            dump.write(json.dumps(dataclasses.asdict(row), default=str) + "\n")
    with open(cluster.workdir / "faults.jsonl", "w", encoding="utf-8") as dump:
        for fault in nemesis.faults:
            dump.write(json.dumps(dataclasses.asdict(fault)) + "\n")
    result = checker.check(rows, alerts, cluster.markers,
                           republish_limit=int(settings.CRON_CELERY["RECONCILE"]["REPUBLISH_LIMIT"]),
                           lost_outcome_logs=checker.outcome_write_failures(cluster.logs), faults=faults,
                           lease=float(str(settings.CRON_CELERY["LEASE_SECONDS"])), jobs=jobs,
                           window=cluster.window, pause_ends=pause_ends)
    print()
    print("== soak report")
    print(f"faults injected: {sum(nemesis.counts.values())}"
          + "".join(f"\n  {kind:16} {nemesis.counts[kind]}" for kind in KINDS if nemesis.counts[kind]))
    print("the person: " + ", ".join(f"{event} {count}" for event, count in sorted(person_counts.items())))
    print(f"jobs: {len(specs.SPECS)}; slots checked: {result.slots}; executions: {len(rows)}; "
          f"bodies run: {result.bodies}; alerts: {result.alerts}")
    print("statuses: " + ", ".join(f"{status} {count}" for status, count in sorted(result.statuses.items())))
    print(start_lag(rows))
    for note, count in sorted(result.notes.items()):
        if count:
            print(f"note: {note}: {count}")
    kinds = Counter({kind: len(found) for kind, found in result.anomalies.items() if found})
    if not kinds:
        print("anomalies: none")
        return 0
    print(f"anomalies: {sum(kinds.values())}")
    for kind, count in sorted(kinds.items()):
        print(f"  {kind} ({count})")
        for line in result.anomalies[kind][:12]:
            print(f"    {line}")
        if count > 12:
            print(f"    ... {count - 12} more")
    return 1
