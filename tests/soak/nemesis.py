"""The nemesis: faults at seeded random moments, each undone after a while, several at once.

Every fault is a pair of actions — inject now, heal later — on a timeline the soak's main loop
runs; a supervisor starts again any process that died (as systemd or Docker would), after a
random delay. Each fault is logged with its wall-clock start and end for the checker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import logging
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import psycopg

from tests.proxy import TcpProxy
from tests.soak.cluster import DATABASE, Cluster, Service

logger = logging.getLogger("soak")

KINDS = ("kill-child", "stop-child", "kill-worker", "stop-worker", "kill-beat", "stop-beat", "lock-master",
         "lock-masters", "broker", "broker-kept", "pg-terminate", "pg-restart", "pg-lock-restart", "clock",
         "partition-db", "partition-redis", "admin-edit")


class Editor(Protocol):
    """Who makes the admin edits (tests.soak.person.Person, which needs Django)."""

    def edit(self, pick: random.Random) -> tuple[str, str, Callable[[], None] | None] | None:
        """(target, detail, the heal that undoes it if any), or None when the database is away."""


class HealLater(Exception):
    """Raised by a heal that cannot act yet (the database it needs is away): it runs again in a while."""


#: Seconds before a heal that raised ``HealLater`` is tried again.
HEAL_AGAIN = 3.0


@dataclasses.dataclass
class Fault:
    kind: str
    target: str
    detail: str
    started: float  # wall clock
    ended: float | None = None


class Nemesis:
    def __init__(self, cluster: Cluster, seed: int, kinds: list[str], *, mean_gap: float = 4.0,
                 editor: Editor | None = None) -> None:
        self.cluster = cluster
        self.editor = editor
        self.random = random.Random(seed)
        self.kinds = kinds
        self.mean_gap = mean_gap
        self.timeline: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.faults: list[Fault] = []
        self.counts: Counter[str] = Counter()
        self.next_fault = time.monotonic() + self.random.uniform(1, 3)
        self.server_busy_until: dict[str, float] = {}
        self.active_heals: dict[int, Callable[[], None]] = {}
        self.healing: Counter[str] = Counter()  # a server's heals still to run: it is not free meanwhile

    # --- the timeline -------------------------------------------------------------------------

    def later(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.timeline, (time.monotonic() + delay, next(self._order), action))

    def run_due(self) -> None:
        now = time.monotonic()
        while self.timeline and self.timeline[0][0] <= now:
            _, _, action = heapq.heappop(self.timeline)
            try:
                action()
            except Exception:
                logger.exception("soak: a nemesis action failed")

    def step(self, injecting: bool) -> None:
        """Run what is due; inject the next fault when its time has come; restart the dead."""
        self.run_due()
        if injecting and time.monotonic() >= self.next_fault:
            self.inject()
            self.next_fault = time.monotonic() + self.random.expovariate(1 / self.mean_gap)
        self.supervise()

    def supervise(self) -> None:
        now = time.monotonic()
        if self._server_free("postgres") and not self.cluster.postgres.running():
            # Down past its fault's time (a fault that blocked the nemesis held back the heal, or
            # something else stopped it): the soak's database must come back; said, as the harness's.
            logger.warning("soak: PostgreSQL was down with no fault holding it; starting it again")
            self.cluster.postgres.start()
        for service in self.cluster.services():
            if service.alive() or service.proc is None or service.retired:
                continue
            if service.restart_at is None:
                service.restart_at = now + self.random.uniform(1, 4)
                logger.info("soak: %s exited (%s); restarting it in a moment", service.name,
                            service.proc.returncode)
            elif now >= service.restart_at:
                service.start()

    def heal_all(self) -> None:
        """Undo every fault now: run every pending heal, resume and restart every process."""
        while self.active_heals:
            _, heal = self.active_heals.popitem()
            try:
                heal()
            except Exception:
                logger.exception("soak: a heal failed")
        self.timeline.clear()
        for service in self.cluster.services():
            if service.stopped:
                service.signal_group(signal.SIGCONT)
                service.stopped = False
            if service.shift:  # back to the real clock
                service.terminate()
                service.shift = 0.0
                service.start()
            elif not service.alive():
                service.start()

    # --- faults -------------------------------------------------------------------------------

    def _begin(self, kind: str, target: str, detail: str = "") -> Fault:
        fault = Fault(kind=kind, target=target, detail=detail, started=time.time())
        self.faults.append(fault)
        self.counts[kind] += 1
        logger.info("soak: fault %s on %s %s", kind, target, detail)
        return fault

    def _heal_later(self, fault: Fault, delay: float, heal: Callable[[], object], server: str = "") -> None:
        """``heal`` after ``delay`` seconds (or at the soak's end); ``server``, if named, is not free for
        another fault until it has run, however late the nemesis gets to it."""
        key = next(self._order)
        self.healing[server] += 1

        def done() -> None:
            self.healing[server] -= 1
            fault.ended = time.time()

        def wrapped() -> None:  # at the soak's end (``heal_all`` took it off the list)
            try:
                heal()
            finally:
                done()

        def run() -> None:
            if key not in self.active_heals:
                return
            try:
                heal()
            except HealLater:
                self.later(HEAL_AGAIN, run)  # still to come: the server stays out of other faults
                return
            except Exception:
                del self.active_heals[key]
                done()
                raise
            del self.active_heals[key]
            done()

        self.active_heals[key] = wrapped
        self.later(delay, run)

    def _free(self, services: list[Service]) -> list[Service]:
        now = time.monotonic()
        return [service for service in services if service.alive() and service.busy_until <= now]

    def _server_free(self, name: str) -> bool:
        return self.healing[name] <= 0 and self.server_busy_until.get(name, 0.0) <= time.monotonic()

    def inject(self) -> None:
        for _ in range(5):  # a kind with no free target: draw another
            kind = self.random.choice(self.kinds)
            if getattr(self, "_" + kind.replace("-", "_"))():
                return

    def _kill_child(self) -> bool:
        return self._child(stop=False)

    def _stop_child(self) -> bool:
        return self._child(stop=True)

    def _child(self, *, stop: bool) -> bool:
        candidates = [(worker, pid) for worker in self._free(self.cluster.workers) for pid in worker.children()]
        if not candidates:
            return False
        worker, pid = self.random.choice(candidates)
        if not stop:
            self._begin("kill-child", worker.name, f"pid {pid}").ended = time.time()
            _signal(pid, signal.SIGKILL)
            return True
        seconds = self.random.uniform(2, 7)
        fault = self._begin("stop-child", worker.name, f"pid {pid} for {seconds:.1f} s")
        _signal(pid, signal.SIGSTOP)
        worker.busy_until = time.monotonic() + seconds + 1
        self._heal_later(fault, seconds, lambda: _signal(pid, signal.SIGCONT))
        return True

    def _kill_worker(self) -> bool:
        return self._kill(self.cluster.workers, "kill-worker")

    def _kill_beat(self) -> bool:
        return self._kill(self.cluster.beats, "kill-beat")

    def _kill(self, services: list[Service], kind: str) -> bool:
        free = self._free(services)
        if not free:
            return False
        service = self.random.choice(free)
        self._begin(kind, service.name, f"generation {service.generation}").ended = time.time()
        service.kill()  # the supervisor starts it again after a while
        return True

    def _stop_worker(self) -> bool:
        return self._stop(self.cluster.workers, "stop-worker", 2, 8)

    def _stop_beat(self) -> bool:
        return self._stop(self.cluster.beats, "stop-beat", 2, 10)

    def _stop(self, services: list[Service], kind: str, shortest: float, longest: float) -> bool:
        free = self._free(services)
        if not free:
            return False
        service = self.random.choice(free)
        seconds = self.random.uniform(shortest, longest)
        fault = self._begin(kind, service.name, f"for {seconds:.1f} s")
        generation = service.generation
        service.signal_group(signal.SIGSTOP)
        service.stopped = True
        service.busy_until = time.monotonic() + seconds + 1

        def resume() -> None:
            if service.generation == generation:
                service.signal_group(signal.SIGCONT)
                service.stopped = False

        self._heal_later(fault, seconds, resume)
        return True

    def _lock_master(self) -> bool:
        return self._locks(1)

    def _lock_masters(self) -> bool:
        return self._locks(2)

    def _locks(self, count: int) -> bool:
        free = [i for i in range(len(self.cluster.locks)) if self._server_free(f"lock-{i}")]
        if len(free) < count:
            return False
        chosen = self.random.sample(free, count)
        seconds = self.random.uniform(2, 8)
        fault = self._begin("lock-master" if count == 1 else "lock-masters", ",".join(f"lock-{i}" for i in chosen),
                            f"down {seconds:.1f} s")
        for i in chosen:
            self.cluster.locks[i].stop()
            self.server_busy_until[f"lock-{i}"] = time.monotonic() + seconds + 1

        def restart() -> None:
            for i in chosen:
                self.cluster.locks[i].start()

        self._heal_later(fault, seconds, restart)
        return True

    def _broker(self) -> bool:
        return self._broker_down(kept=False)

    def _broker_kept(self) -> bool:
        return self._broker_down(kept=True)

    def _broker_down(self, *, kept: bool) -> bool:
        """The broker killed for a while (the beats' reconcilers pass meanwhile): its queues come
        back from its append-only file (``broker-kept``), or are lost with it (``broker``)."""
        if not self._server_free("broker"):
            return False
        seconds = self.random.uniform(2, 6)
        kind = "broker-kept" if kept else "broker"
        fault = self._begin(kind, "broker", f"down {seconds:.1f} s (its messages {'kept' if kept else 'lost'})")
        self.cluster.broker.stop()
        if not kept:
            self.cluster.broker.forget()
        self.server_busy_until["broker"] = time.monotonic() + seconds + 2
        self._heal_later(fault, seconds, self.cluster.broker.start, server="broker")
        return True

    def _pg_terminate(self) -> bool:
        if not self._server_free("postgres"):
            return False
        try:
            ended = self.cluster.postgres.terminate_backends(DATABASE)
        except psycopg.OperationalError:  # down after all (a restart that ran late): another fault instead
            return False
        self._begin("pg-terminate", "postgres", f"{ended} backends").ended = time.time()
        return True

    def _pg_restart(self) -> bool:
        if not self._server_free("postgres"):
            return False
        mode = self.random.choice(["fast", "immediate"])
        seconds = self.random.uniform(0, 3)
        fault = self._begin("pg-restart", "postgres", f"{mode}, down {seconds:.1f} s")
        self.cluster.postgres.stop(mode)
        self.server_busy_until["postgres"] = time.monotonic() + seconds + 5
        self._heal_later(fault, seconds, self._postgres_up, server="postgres")
        return True

    def _postgres_up(self) -> None:
        """PostgreSQL started, unless it runs already (``supervise`` may have started it while a fault
        that blocked the nemesis held back this heal)."""
        if not self.cluster.postgres.running():
            self.cluster.postgres.start()

    def _pg_lock_restart(self) -> bool:
        """A migration-like ACCESS EXCLUSIVE lock on the jobs' or the executions' table, held for a
        few seconds while every claim and dispatch queues behind it; then PostgreSQL restarts with
        the lock still held (its holder never commits)."""
        if not self._server_free("postgres"):
            return False
        table = self.random.choice(["cron_celery_cronjob", "cron_celery_cronexecution"])
        held, down = self.random.uniform(1, 5), self.random.uniform(0, 3)
        mode = self.random.choice(["fast", "immediate"])
        try:
            holder = psycopg.connect(self.cluster.postgres.url(DATABASE), connect_timeout=3, autocommit=False)
            holder.execute("SET lock_timeout = '3s'")
            holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        except psycopg.Error:
            return False
        fault = self._begin("pg-lock-restart", "postgres", f"{table} locked {held:.1f} s, then {mode}, "
                            f"down {down:.1f} s")
        self.server_busy_until["postgres"] = time.monotonic() + held + down + 5

        def restart() -> None:
            # Run late (the nemesis was busy healing), it still keeps PostgreSQL out of other draws
            # until it is started again.
            self.server_busy_until["postgres"] = max(self.server_busy_until["postgres"], time.monotonic() + down + 5)
            self.cluster.postgres.stop(mode)
            with contextlib.suppress(psycopg.Error):
                holder.close()

        def heal() -> None:  # started again (or, at the soak's end, whatever is left of it undone)
            self._postgres_up()
            with contextlib.suppress(psycopg.Error):
                holder.close()

        self._heal_later(fault, held + down, heal, server="postgres")
        self.later(held, restart)
        return True

    def _admin_edit(self) -> bool:
        if self.editor is None:
            return False
        done = self.editor.edit(self.random)
        if done is None:  # the database is away: another fault instead
            return False
        target, detail, undo = done
        fault = self._begin("admin-edit", target, detail)
        if undo is None:
            fault.ended = time.time()
        else:
            self._heal_later(fault, self.random.uniform(3, 12), undo)
        return True

    def _clock(self) -> bool:
        free = [worker for worker in self._free(self.cluster.workers) if not worker.shift]
        if not free:
            return False
        worker = self.random.choice(free)
        shift = self.random.choice([-1, 1]) * self.random.uniform(20, 40)
        seconds = self.random.uniform(10, 25)
        fault = self._begin("clock", worker.name, f"restarted with its clock {shift:+.0f} s for {seconds:.0f} s")
        worker.busy_until = time.monotonic() + seconds + 25
        worker.terminate()
        worker.shift = shift
        worker.start()

        def back() -> None:
            worker.terminate()
            worker.shift = 0.0
            worker.start()

        self._heal_later(fault, seconds, back)
        return True

    def _partition_db(self) -> bool:
        return self._partition("partition-db", lambda index: [self.cluster.db_proxies[index]])

    def _partition_redis(self) -> bool:
        return self._partition("partition-redis", lambda index: self.cluster.redis_proxies[index])

    def _partition(self, kind: str, proxies_of: Callable[[int], list[TcpProxy]]) -> bool:
        free = self._free(self.cluster.workers)
        if not free:
            return False
        worker = self.random.choice(free)
        proxies = proxies_of(self.cluster.workers.index(worker))
        how = self.random.choice(["cut", "blackhole"])
        seconds = self.random.uniform(2, 8)
        fault = self._begin(kind, worker.name, f"{how} for {seconds:.1f} s")
        for proxy in proxies:
            getattr(proxy, how)()
        worker.busy_until = time.monotonic() + seconds + 1

        def heal() -> None:
            for proxy in proxies:
                proxy.heal()

        self._heal_later(fault, seconds, heal)
        return True


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
