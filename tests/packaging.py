"""The artefacts a user downloads: the sdist and the wheel, built as a release would build them.

``python -m build`` runs on a copy of the files git would ship (tracked, plus new files not
ignored), never on the checkout itself: the two Django lines build side by side, and
setuptools writes its ``egg-info`` and ``build/`` next to the sources. The copy also keeps a
stray local file (an editor's backup, a ``site/`` build) from reaching a release.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path
    log: str  # what the build printed


def shipped_files() -> list[str]:
    """The repository's files as a release sees them: tracked or new, never ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return sorted(name for name in listed if name and (ROOT / name).is_file())


def build(workdir: Path) -> Dist:
    source = workdir / "source"
    for name in shipped_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    out = workdir / "dist"
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={key: value for key, value in os.environ.items() if not key.startswith("PYTHON")})
    assert done.returncode == 0, f"python -m build failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(out.iterdir())
    return Dist(wheel=wheels[0], sdist=sdists[0], log=done.stdout)


def user_python() -> list[str]:
    """The interpreter a newcomer's ``python3 -m venv`` would be, for this test line.

    The Django 5.2 line (Python 3.11) takes its own base interpreter; the Django 6.0 line
    (Python 3.12, which the whole suite runs on) takes Python 3.13, so that every Python the
    classifiers name is installed from the wheel or tested in full. pip picks the Django line
    by itself: Django 6.0 needs Python 3.12 or later.
    """
    if sys.version_info[:2] == (3, 11):
        return [getattr(sys, "_base_executable", sys.executable)]
    versions = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True,
                              check=False).stdout.split()
    found = sorted((v for v in versions if v.startswith("3.13.")), key=lambda v: [int(p) for p in v.split(".")])
    assert found, f"Python 3.13 is not installed under pyenv (versions: {versions}); the wheel test needs it"
    return ["env", f"PYENV_VERSION={found[-1]}", "python3.13"]
