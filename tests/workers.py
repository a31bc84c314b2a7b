"""Real ``celery worker`` processes for fault tests: started, paused, resumed and killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.celery_app import app
from tests.conftest import ROOT, subprocess_env


class Worker:
    def __init__(self, tmp: Path, env: dict[str, str], *, pool: str = "solo", concurrency: int = 1,
                 broker_url: str | None = None, queues: list[str] | None = None) -> None:
        self.broker_url = broker_url  # None: the test session's broker
        self.name = f"fault-{uuid.uuid4().hex[:6]}@localhost"
        self.log = tmp / f"{self.name.split('@')[0]}.log"
        self.env = subprocess_env(**env)
        self.args = [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker",
                     "--pool", pool, "--concurrency", str(concurrency), "-n", self.name,
                     "--without-gossip", "--without-mingle", "--without-heartbeat",
                     "--loglevel", "INFO", "--prefetch-multiplier", "1"]
        if queues:  # consume only these queues (``-Q``), not the session's default one
            self.args += ["-Q", ",".join(queues)]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> Worker:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.output()[-3000:]}")
            if self.broker_url is not None:  # a broker of the test's own: the worker says when it is ready
                if f"{self.name} ready." in self.output():
                    return self
                time.sleep(0.1)
            elif app.control.ping(destination=[self.name], timeout=0.5):
                return self
        raise RuntimeError(f"worker did not answer a ping:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self.proc = None
