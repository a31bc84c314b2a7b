"""The processes ``bench/latency.py`` starts: each beat, worker and lock master runs in its own
process group with its output in a log file, and is stopped by its group.

``RedisMaster`` is a throw-away ``redis-server`` on a free port of 127.0.0.1 (no snapshots, no
append-only file); ``wait_until`` polls a condition while checking that the processes it was given
are still alive.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from bench.common import ROOT, BenchError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Process:
    """A subprocess in its own process group, its output in a log file."""

    def __init__(self, name: str, cmd: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(env), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float = 30) -> None:
        """SIGTERM to the process (a worker's warm shutdown lets its pool finish the tasks in
        hand; a signal to the whole group would kill them mid-task), then SIGKILL whatever is
        left of its group."""
        group = self.proc.pid  # start_new_session: the group's id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)  # the leader, or orphaned pool children
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._log.close()


class RedisMaster(Process):
    """A throw-away ``redis-server`` on a free port: one of the three lock masters."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        directory = workdir / f"redis-{self.port}"
        directory.mkdir(parents=True, exist_ok=True)
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        super().__init__(f"redis-server :{self.port}",
                         [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--dir", str(directory)], os.environ, directory / "redis.log")
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise BenchError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def wait_until(what: str, condition: Callable[[], bool], timeout: float, processes: list[Process],
               interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for process in processes:
            process.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
