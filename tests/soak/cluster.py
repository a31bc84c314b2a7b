"""The soak's processes: servers it owns, and supervised worker and beat processes that it can
kill, pause, restart (under a shifted clock too) and partition through proxies of its own."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.pg_servers import PostgresServer
from tests.proxy import TcpProxy
from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent.parent
DATABASE = "cc_soak"


def group_members(pgid: int) -> list[tuple[int, int]]:
    """(pid, parent pid) of every process in process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append((int(entry.name), int(fields[1])))
    return found


def is_celery(pid: int) -> bool:
    """A Python process running celery (not a wrapper such as faketime or unshare that names it)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return Path(argv[0].decode(errors="replace")).name.startswith("python") and b"celery" in argv


@dataclasses.dataclass
class Service:
    """A supervised process (a worker or a beat) in a process group of its own."""

    name: str
    args: list[str]
    env: dict[str, str]
    logdir: Path
    proc: subprocess.Popen[bytes] | None = None
    generation: int = 0
    shift: float = 0.0  # seconds its clock runs ahead (faketime); 0 = the real clock
    restart_at: float | None = None  # monotonic time the supervisor starts it again
    busy_until: float = 0.0  # a fault acts on it until then: the nemesis leaves it alone
    stopped: bool = False  # SIGSTOPped by the nemesis
    retired: bool = False  # stopped for good: the supervisor leaves it down

    @property
    def log(self) -> Path:
        return self.logdir / f"{self.name}.log"

    def start(self) -> None:
        self.generation += 1
        env = {**self.env, "CRON_SOAK_CLOCK_SHIFT": f"{self.shift:g}"}
        args = [arg.replace("{generation}", str(self.generation)) for arg in self.args]
        if self.shift:
            args = ["/usr/bin/faketime", "-f", f"{self.shift:+g}s", *args]
        with open(self.log, "ab") as log:
            log.write(f"\n===== soak: start #{self.generation} shift {self.shift:+g}s at {time.time():.3f}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.stopped = False
        self.restart_at = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def main_pid(self) -> int | None:
        """The celery process itself (under faketime or unshare, a child of the wrapper)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        if is_celery(self.proc.pid):
            return self.proc.pid
        members = group_members(self.proc.pid)
        for pid, parent in members:
            if is_celery(pid) and not is_celery(parent):
                return pid
        return None

    def children(self) -> list[int]:
        """The prefork pool's processes."""
        main = self.main_pid()
        if main is None or self.proc is None:
            return []
        return [pid for pid, parent in group_members(self.proc.pid) if parent == main]

    def kill(self) -> None:
        """SIGKILL the whole group (as a container's kill does) and reap it."""
        if self.proc is None:
            return
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stopped = False

    def terminate(self, timeout: float = 20) -> None:
        """SIGTERM (a warm shutdown: the worker tells its jobs and waits for them), then SIGKILL."""
        if self.proc is None:
            return
        if self.stopped:
            self.signal_group(signal.SIGCONT)
            self.stopped = False
        main = self.main_pid()
        if main is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(main, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.alive() or group_members(self.proc.pid)):
            time.sleep(0.1)
        self.kill()

    def ready(self) -> bool:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"===== soak: start #{self.generation} " in text and " ready." in text.rsplit(
            f"===== soak: start #{self.generation} ", 1)[1]


class Cluster:
    """PostgreSQL, the broker, three lock masters, the workers (each behind proxies of its own
    to PostgreSQL, the broker and every lock master) and two beats."""

    def __init__(self, workdir: Path, *, workers: int = 3, beats: int = 2, processes: int = 4) -> None:
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.markers = workdir / "markers"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.markers.mkdir(parents=True, exist_ok=True)
        self.postgres = PostgresServer(workdir)
        self.broker = RedisServer(workdir, persistent=True)  # the broker fault may keep its queues or not
        self.locks = [RedisServer(workdir) for _ in range(3)]
        self.worker_count, self.beat_count, self.processes = workers, beats, processes
        self.workers: list[Service] = []
        self.beats: list[Service] = []
        #: Per worker: its proxies to the database, the broker and each lock master.
        self.db_proxies: list[TcpProxy] = []
        self.redis_proxies: list[list[TcpProxy]] = []
        #: The windowed job's window, epoch seconds (``window_for``).
        self.window = (0.0, 0.0)

    def window_for(self, seconds: float) -> None:
        """Open the windowed job's window a quarter into ``seconds`` of faults (from about now, after
        the workers' start) and close it at two thirds."""
        opens = int(time.time() + 15 + seconds / 4)
        self.window = (opens, opens + max(10, int(seconds * 5 / 12)))

    def base_env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("CRON_", "DJANGO_"))}
        env.update(DJANGO_SETTINGS_MODULE="tests.soak.settings", PYTHONPATH=str(ROOT),
                   CRON_SOAK_MARKERS=str(self.markers), PYTHONUNBUFFERED="1",
                   CRON_SOAK_WINDOW=f"{self.window[0]:.0f},{self.window[1]:.0f}")
        return env

    def direct_env(self) -> dict[str, str]:
        return {**self.base_env(), "CRON_SOAK_DATABASE_URL": self.postgres.url(DATABASE),
                "CRON_SOAK_BROKER_URL": self.broker.url,
                "CRON_SOAK_LOCK_MASTERS": ",".join(lock.url for lock in self.locks)}

    def start_servers(self) -> None:
        self.postgres.start()
        self.postgres.create_database(DATABASE)
        self.broker.start()
        for lock in self.locks:
            lock.start()

    def make_services(self) -> None:
        celery = [sys.executable, "-m", "celery", "-A", "tests.soak.celery_app"]
        for index in range(self.worker_count):
            # Workers 1 and 2 share one node name, each in a pid namespace of its own: their pool
            # processes have the same pids on the same host (two containers of one image).
            shared = index in (1, 2)
            wrapper = ["unshare", "--pid", "--fork", "--kill-child"] if shared else []
            node = "soak-shared@%h" if shared else f"soak-{index}@%h"
            db = TcpProxy(self.postgres.port).start()
            redis = [TcpProxy(self.broker.port).start(), *(TcpProxy(lock.port).start() for lock in self.locks)]
            self.db_proxies.append(db)
            self.redis_proxies.append(redis)
            env = {**self.base_env(), "CRON_SOAK_DATABASE_URL": f"postgres://postgres@127.0.0.1:{db.port}/{DATABASE}",
                   "CRON_SOAK_BROKER_URL": f"redis://127.0.0.1:{redis[0].port}/0",
                   "CRON_SOAK_LOCK_MASTERS": ",".join(f"redis://127.0.0.1:{proxy.port}/0" for proxy in redis[1:])}
            self.workers.append(Service(
                name=f"worker-{index}", env=env, logdir=self.logs,
                args=[*wrapper, *celery, "worker", "--pool", "prefork", "--concurrency", str(self.processes),
                      "-n", node, "--without-gossip", "--without-mingle", "--without-heartbeat",
                      "--prefetch-multiplier", "1", "-Q", "cron-soak", "--loglevel", "INFO"]))
        for index in range(self.beat_count):
            self.beats.append(Service(
                name=f"beat-{index}", env=self.direct_env(), logdir=self.logs,
                args=[*celery, "beat", "-S", "cron_celery.beat.Scheduler", "--max-interval", "1", "--loglevel", "INFO",
                      "--pidfile", str(self.workdir / f"beat-{index}-{{generation}}.pid")]))

    def services(self) -> list[Service]:
        return [*self.workers, *self.beats]

    def close(self) -> None:
        for service in self.services():
            with contextlib.suppress(Exception):
                service.kill()
        for proxy in [*self.db_proxies, *(p for group in self.redis_proxies for p in group)]:
            with contextlib.suppress(Exception):
                proxy.close()
        for server in [self.broker, *self.locks]:
            with contextlib.suppress(Exception):
                server.stop()
        with contextlib.suppress(Exception):
            self.postgres.close()
