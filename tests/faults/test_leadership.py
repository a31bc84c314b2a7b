"""Leadership without a Redis quorum: real ``celery beat`` processes whose lock masters are all
down (or go down and come back) still agree on one leader, through the lease row in
PostgreSQL, so django-celery-beat's plain periodic tasks are sent by one beat only."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from cron_celery.decisions import leadership
from cron_celery.models import Lease
from tests.conftest import marked, wait_for
from tests.faults.test_beat import beat_log, start_beat, stop
from tests.redis_servers import RedisServer
from tests.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def ping_times(marker: Path) -> list[float]:
    return [float(line.split()[1]) for line in marked(marker) if line.startswith("plain-ping ")]


def pings_between(marker: Path, start: float, end: float) -> int:
    return sum(1 for moment in ping_times(marker) if start <= moment < end)


def one_sender(marker: Path, seconds: float) -> tuple[int, float]:
    """Count the pings of the next ``seconds`` (sent every second: one sender sends about
    ``seconds``, two about twice as many)."""
    start = time.time()
    time.sleep(seconds)
    count = pings_between(marker, start, time.time())
    return count, seconds + 2


def lease() -> tuple[str, bool] | None:
    """The beat lease's holder and whether it is held now, by the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT holder, lease_until > now() FROM {Lease._meta.db_table} WHERE name = 'beat'")
        row = cursor.fetchone()
    return (str(row[0]), bool(row[1])) if row else None


def pid_of_leader() -> int | None:
    held = lease()
    return int(held[0].rsplit(":", 1)[1]) if held and held[1] else None


@contextmanager
def plain_ping_fleet(tmp: Path, marker: Path, masters: list[RedisServer], **extra: str
                     ) -> Iterator[tuple[dict[str, str], list[subprocess.Popen[bytes]]]]:
    """A plain django-celery-beat periodic task every second, a worker that runs it, and two
    beats whose lock masters are ``masters``."""
    every_second, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name="plain ping", task="tests.jobsapp.tasks.plain_ping", interval=every_second)
    env = {"CRON_TEST_LOCK_MASTERS": ",".join(server.url for server in masters), "CRON_TEST_LOCK_TTL": "3",
           "CRON_TEST_LEASE_SECONDS": "15", "CRON_TEST_BEAT_LEASE_SECONDS": "3", "CRON_TEST_MARKER": str(marker),
           **extra}
    worker = Worker(tmp, env, pool="prefork", concurrency=2).start()
    beats: list[subprocess.Popen[bytes]] = []
    try:
        beats.extend(start_beat(tmp, env, i) for i in range(2))
        wait_for(lambda: len(ping_times(marker)) >= 3, timeout=60, what="the first pings")
        yield env, beats
    finally:
        for proc in beats:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
            stop(proc)
        worker.stop()


def test_without_a_redis_quorum_one_beat_sends_the_plain_tasks_and_the_standby_takes_over(tmp_path, marker):
    masters = [RedisServer(tmp_path).start() for _ in range(3)]
    for server in masters:  # all down: their ports refuse connections
        server.stop()
    with plain_ping_fleet(tmp_path, marker, masters) as (_env, beats):
        sent, most = one_sender(marker, 12)
        assert sent <= most, f"{sent} pings in 12 s: both beats sent them"
        leader_pid = pid_of_leader()
        assert leader_pid in (beats[0].pid, beats[1].pid), lease()
        leader = 0 if beats[0].pid == leader_pid else 1
        standby = 1 - leader
        assert "is now the leader (database lease; no Redis quorum)" in beat_log(tmp_path, leader)
        assert "is now the leader" not in beat_log(tmp_path, standby)

        os.killpg(beats[leader].pid, signal.SIGKILL)  # no goodbye: its lease must run out (3 s)
        beats[leader].wait(timeout=10)
        wait_for(lambda: pid_of_leader() == beats[standby].pid, timeout=30, what="the standby to take the lease")
        wait_for(lambda: "is now the leader" in beat_log(tmp_path, standby), timeout=10, what="the standby's log")
        taken = time.time()
        wait_for(lambda: pings_between(marker, taken, time.time() + 1) >= 3, timeout=30,
                 what="pings sent by the new leader")
        sent, most = one_sender(marker, 6)
        assert 2 <= sent <= most, f"{sent} pings in 6 s after the takeover"


def test_one_leader_through_a_redis_outage_and_its_return(tmp_path, marker):
    """Redis leads, then its only master dies (the database lease carries on alone), then it
    comes back on the same port: never two senders, in any phase."""
    master = RedisServer(tmp_path).start()
    try:
        with plain_ping_fleet(tmp_path, marker, [master]) as (_env, beats):
            sent, most = one_sender(marker, 6)
            assert sent <= most, f"Redis up: {sent} pings in 6 s"
            assert list(master.client().scan_iter(match="*beat-leader*")), "no Redlock lease while Redis is up"
            master.stop()
            sent, most = one_sender(marker, 10)
            assert sent <= most, f"Redis down: {sent} pings in 10 s"
            assert pid_of_leader() in (beats[0].pid, beats[1].pid), lease()
            master.start()
            time.sleep(3)  # a lease period for the modes to meet again
            sent, most = one_sender(marker, 10)
            assert sent <= most, f"Redis back: {sent} pings in 10 s"
            assert sent >= 3, f"Redis back: only {sent} pings in 10 s (nobody leads?)"
            holder = pid_of_leader()
            assert holder in (beats[0].pid, beats[1].pid), lease()
            keys = list(master.client().scan_iter(match="*beat-leader*"))
            assert keys, "Redis is back but the leader holds no Redlock lease"
    finally:
        master.stop()


def test_without_a_redis_quorum_a_leader_stopped_with_sigterm_releases_the_database_lease(tmp_path, marker):
    """A 30 s lease: the stopped leader's row is seen ended (released, not run out) while the
    standby is paused, then the standby takes it."""
    masters = [RedisServer(tmp_path).start()]
    masters[0].stop()
    with plain_ping_fleet(tmp_path, marker, masters, CRON_TEST_BEAT_LEASE_SECONDS="30") as (_env, beats):
        leader_pid = pid_of_leader()
        assert leader_pid in (beats[0].pid, beats[1].pid), lease()
        leader = 0 if beats[0].pid == leader_pid else 1
        standby = 1 - leader
        os.killpg(beats[standby].pid, signal.SIGSTOP)
        stop(beats[leader])  # SIGTERM, and waits for the process to exit
        after = lease()
        os.killpg(beats[standby].pid, signal.SIGCONT)
        assert after is not None and after[0].endswith(f":{leader_pid}") and not after[1], after
        wait_for(lambda: pid_of_leader() == beats[standby].pid, timeout=20, what="the standby to take the lease")


def test_the_lease_row_on_the_database_clock():
    """The statements behind both leases: one holder at a time, renewal by the holder only,
    expiry judged by the database's clock, release ends it at once."""
    assert leadership.hold("probe", "token-a", "host-a:1", 30)
    assert not leadership.hold("probe", "token-b", "host-b:2", 30)  # held by a
    assert leadership.hold("probe", "token-a", "host-a:1", 30)  # renewed
    assert leadership.holder("probe") == "host-a:1"
    with connection.cursor() as cursor:  # a's lease runs out (its beat froze): by the database's clock
        cursor.execute(f"UPDATE {Lease._meta.db_table} SET lease_until = now() - interval '1 second'")
    assert leadership.holder("probe") is None
    assert leadership.hold("probe", "token-b", "host-b:2", 30)  # b takes it over
    assert not leadership.hold("probe", "token-a", "host-a:1", 30)  # a, thawed, cannot renew it
    assert not leadership.release("probe", "token-a")  # nor end b's lease
    assert leadership.release("probe", "token-b")
    assert leadership.holder("probe") is None
    assert leadership.hold("probe", "token-a", "host-a:1", 30)  # free at once, no waiting for it to run out
    since = Lease.objects.get(name="probe").since
    assert leadership.hold("probe", "token-a", "host-a:1", 30)
    assert Lease.objects.get(name="probe").since == since  # a renewal keeps the holder's start
