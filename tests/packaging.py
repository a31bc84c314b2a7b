"""The artefacts a user downloads: the sdist and the wheel, built as a release would build them.

``python -m build`` runs on a copy of the files git would ship (tracked, plus new files not
ignored), never on the checkout itself: the two Django lines build side by side, and
setuptools writes its ``egg-info`` and ``build/`` next to the sources. The copy also keeps a
stray local file (an editor's backup, a ``site/`` build) from reaching a release.
"""

from __future__ import annotations

import dataclasses
import os
import re
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


#: The Python a newcomer's ``python3 -m venv`` is, for each Django line the suite runs on. The
#: Django 5.2 line (the suite on Python 3.11) installs the wheel on 3.11; the Django 6.0 line (the
#: suite on Python 3.12) installs it on 3.13, so every Python the classifiers name is either
#: installed from the wheel or tested in full. pip picks the Django line itself: 6.0 needs 3.12+.
USER_PYTHON = {(5, 2): "3.11", (6, 0): "3.13"}


def user_python(django_line: tuple[int, int]) -> list[str]:
    """A command that runs the newcomer's Python for ``django_line``: ``pythonX.Y`` from the
    PATH when it runs, else the newest ``X.Y.*`` that pyenv has installed."""
    wanted = USER_PYTHON.get(django_line)
    assert wanted, f"no user Python is named for Django {django_line} (USER_PYTHON: {USER_PYTHON})"
    command = f"python{wanted}"
    if shutil.which(command) and subprocess.run([command, "-c", "pass"], capture_output=True,
                                                check=False).returncode == 0:
        return [command]  # a pyenv shim exits non-zero unless its version is selected
    listed = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True,
                            check=False).stdout if shutil.which("pyenv") else ""
    found = sorted((version for version in re.findall(rf"^\s*({re.escape(wanted)}\.\d+)\s*$", listed, flags=re.M)),
                   key=lambda version: [int(part) for part in version.split(".")])
    assert found, f"Python {wanted} is neither on the PATH nor installed under pyenv ({listed.split()}); " \
                  "the wheel test needs it"
    return ["env", f"PYENV_VERSION={found[-1]}", command]
