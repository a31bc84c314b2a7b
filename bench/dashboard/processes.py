"""The processes the picture starts (Redis, the web process, the worker, the beats, Prometheus),
each logging to a file of its own, and stopped on the way out."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.dashboard.machine import EXAMPLE, log


class Processes:
    """The processes this script started, each in a process group of its own (so that stopping
    one also stops what it started: the worker's pool), stopped in the reverse order."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: Sequence[str], *, env: dict[str, str], cwd: Path = EXAMPLE) -> None:
        with open(self.logs / f"{name}.log", "wb") as output:
            self.running[name] = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                                  stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        log(f"{name}: pid {self.running[name].pid} (log {self.logs / name}.log)")

    def check(self) -> None:
        for name, process in self.running.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited on its own (status {process.returncode})")

    def log_has(self, name: str, text: str) -> bool:
        return text in (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self, name: str) -> None:
        """SIGTERM to the process's group, SIGKILL if anything of it is left after 15 s."""
        process = self.running.pop(name)
        group = process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            process.poll()
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            log(f"!! {name} did not stop in 15 s; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)

    def stop_all(self) -> None:
        for name in reversed(list(self.running)):
            self.stop(name)

    def tails(self) -> None:
        for path in sorted(self.logs.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-15:]
            print(f"!! last lines of {path}:", *lines, sep="\n  ", file=sys.stderr)
