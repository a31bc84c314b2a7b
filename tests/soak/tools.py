"""Debian tools the soak needs, installed when missing (a missing tool fails the soak)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests import faketime_leftovers

FAKETIME = "/usr/bin/faketime"


def need_faketime() -> str:
    """Debian's ``faketime`` (the ``clock`` fault restarts a worker under it); what dead processes left
    of it in /dev/shm is cleared first (a pid given again would fail with "sem_open: File exists")."""
    faketime_leftovers.clear_stale()
    if not Path(FAKETIME).exists():
        apt = shutil.which("apt-get")
        if apt is None:
            raise RuntimeError("Debian's faketime is needed for the clock fault and apt-get is missing")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        result = subprocess.run([apt, "install", "-y", "-q", "faketime"], env=env, capture_output=True, text=True,
                                timeout=900, check=False)
        if not Path(FAKETIME).exists():
            raise RuntimeError(f"could not install faketime:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return FAKETIME
