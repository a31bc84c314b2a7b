"""The processes and keys of one timed run of ``bench/overhead.py``: its ``celery worker``, py-spy
sampling that worker (``--profile``), and the sweep of the Redis keys and members a run leaves.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, BenchError

PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: "queue\x06\x16<priority>" keys
PRIORITY_STEPS = (3, 6, 9)
#: Samples per second of each sampled process (py-spy's default is 100).
PROFILE_RATE = 200


class Worker:
    """One ``celery worker`` subprocess in its own process group."""

    def __init__(self, *, node: str, queue: str, env: dict[str, str], concurrency: int,
                 log_path: Path) -> None:
        self.node = node
        self.log_path = log_path
        self.cmd = [
            sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
            "--pool", "prefork", "--concurrency", str(concurrency), "-Q", queue, "-n", node,
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", "WARNING",
        ]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"the worker exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Warm shutdown (SIGTERM to the group), then SIGKILL whatever is left of it."""
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # the leader or orphaned pool children
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            raise BenchError(f"worker process group {pgid} is still alive")
        self._log.close()


# ---------------------------------------------------------------------------- profiler


def py_spy() -> str:
    """py-spy beside this interpreter (the dev extras install it), else on the PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise BenchError("--profile needs py-spy (pip install py-spy; it is in the dev extras)")
    return found


def start_profiler(worker: Worker, out: Path, logdir: Path) -> subprocess.Popen[bytes]:
    """py-spy on the worker and its pool processes: every thread, idle ones too (a wait on
    PostgreSQL is time a run takes), one frame per function, raw (collapsed) stacks to ``out``."""
    cmd = [py_spy(), "record", "--pid", str(worker.proc.pid), "--subprocesses", "--idle", "--threads",
           "--nolineno", "--rate", str(PROFILE_RATE), "--format", "raw", "--output", str(out)]
    spy_log = open(logdir / "py-spy.log", "wb")  # noqa: SIM115 - the child keeps it; closed with it
    spy = subprocess.Popen(cmd, stdout=spy_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           start_new_session=True)
    spy_log.close()
    deadline = time.monotonic() + 10
    while b"Sampling" not in (logdir / "py-spy.log").read_bytes():
        if spy.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"py-spy did not start: {(logdir / 'py-spy.log').read_text(errors='replace')}")
        time.sleep(0.05)
    return spy


def stop_profiler(spy: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for py-spy: it writes its file and ends."""
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout=60)
    except subprocess.TimeoutExpired:
        spy.kill()
        raise BenchError("py-spy did not stop within a minute") from None


# ------------------------------------------------------------------------------- redis


def queue_keys(queue: str) -> list[str]:
    return [queue, *(f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS),
            f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"]


