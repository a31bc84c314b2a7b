"""Throw-away ``redis-server`` processes on free ports, for tests that break Redis on purpose.

Only servers started here are ever stopped or flushed; the machine's own Redis is never
touched.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """``persistent``: every write is appended to a file and fsynced before Redis answers
    (``appendonly yes``, ``appendfsync always``), so ``stop()`` (a kill) and ``start()`` again on the
    same port and directory bring back every key: a broker restarted with its queues."""

    def __init__(self, workdir: Path, *, persistent: bool = False) -> None:
        self.port = free_port()
        self.workdir = workdir / f"redis-{self.port}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        appendonly = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             *appendonly, "--dir", str(self.workdir), "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return self
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def forget(self) -> None:
        """Delete what a persistent server wrote (with the server stopped): its next start is empty."""
        for path in sorted(self.workdir.rglob("*"), reverse=True):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None
