"""Redis servers of the lock benchmark's own, on free ports, stopped with it (and with its process,
should it die): never the machine's Redis."""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from bench.common import BenchError

MACHINE_REDIS_PORT = 6379  # never started on, never contacted


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when this process dies (Linux), so that even a
    SIGKILLed benchmark leaves no ``redis-server`` behind."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class RedisServer:
    """One throw-away ``redis-server`` on a free port, in a directory of its own."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, attempts: int = 5) -> RedisServer:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        for _ in range(attempts):
            self.port = free_port()
            if self.port == MACHINE_REDIS_PORT:
                continue
            workdir = self.workdir / f"redis-{self.port}"
            workdir.mkdir(parents=True, exist_ok=True)
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(workdir), "--daemonize", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
            )
            if self._wait_ready():
                return self
            self.stop()  # the port was taken in between: try another
        raise BenchError(f"could not start redis-server ({binary})")

    def _wait_ready(self) -> bool:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc is not None and self.proc.poll() is None:
                try:
                    pid = int(client.info("server")["process_id"])
                except redis.RedisError:
                    time.sleep(0.05)
                    continue
                # Answered: it must be the process started here, not someone else's server.
                return pid == self.proc.pid
            return False
        finally:
            client.close()

    def version(self) -> str:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        try:
            return str(client.info("server")["redis_version"])
        finally:
            client.close()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# ---------------------------------------------------------------------------- variants


def nothing() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()
