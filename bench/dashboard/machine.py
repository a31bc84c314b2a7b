"""The machine the picture is made on: the repository's paths, Debian's tools (installed when
missing), a free port, plain HTTP, and waiting until something is ready."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / "example"
PROMETHEUS = "/usr/bin/prometheus"
CHROMIUM = "/usr/bin/chromium"
REDIS_SERVER = "/usr/bin/redis-server"


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def debian_tool(path: str, package: str) -> None:
    """Install Debian's ``package`` with apt-get when ``path`` is missing."""
    if Path(path).exists():
        return
    apt = shutil.which("apt-get")
    if apt is None:
        sys.exit(f"!! {path} is missing and there is no apt-get to install Debian's {package}")
    log(f"installing Debian's {package} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([apt, "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", package], env=env,
                   check=False, stdout=subprocess.DEVNULL)
    if not Path(path).exists():
        sys.exit(f"!! could not install Debian's {package} ({path} is still missing)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def http(url: str, *, token: str = "", data: bytes | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return int(answer.status), bytes(answer.read())
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()


def wait_for(what: str, ready: Callable[[], bool], timeout: float, alive: Callable[[], None]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive()
        with contextlib.suppress(OSError):
            if ready():
                return
        time.sleep(0.3)
    raise RuntimeError(f"{what} was not ready in {timeout:g} s")
