"""The release artefacts: what ``python -m build`` makes of this checkout, read as an index and a
user read them. The wheel installed and used through the quickstart is tests/test_quickstart.py.
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.message import Message

from cron_celery import __version__
from tests import packaging
from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
DIST_INFO = f"cron_celery-{__version__}.dist-info"
#: A Markdown link or image target: [text](target) or ![alt](target).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)")


def metadata(dist: packaging.Dist) -> Message:
    with zipfile.ZipFile(dist.wheel) as wheel:
        return email.parser.Parser().parsestr(wheel.read(f"{DIST_INFO}/METADATA").decode())


def test_the_artefacts_are_named_for_the_version_in_one_place(dist):
    assert dist.wheel.name == f"cron_celery-{__version__}-py3-none-any.whl"
    assert dist.sdist.name == f"cron_celery-{__version__}.tar.gz"
    assert PYPROJECT["project"]["dynamic"] == ["version"]  # read from cron_celery.__version__ only
    assert "version" not in PYPROJECT["project"]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    first = re.search(r"^## \[(?P<version>[^\]]+)\] - (?P<date>\d{4}-\d{2}-\d{2}|Unreleased)$", changelog, re.M)
    assert first and first["version"] == __version__, "CHANGELOG.md's newest entry is not this version"
    assert re.search(r"^### (Added|Changed|Deprecated|Removed|Fixed|Security)$", changelog, re.M)


def test_twine_check_strict_passes(dist):
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(dist.wheel), str(dist.sdist)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_wheel_holds_the_package_its_templates_migrations_and_py_typed_and_nothing_else(dist):
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
    package = {name for name in names if not name.startswith(f"{DIST_INFO}/")}
    shipped = {name for name in packaging.shipped_files() if name.startswith("cron_celery/")}
    # Every source file of the package, and nothing that is not one (tests, bench, example, caches).
    assert package == shipped, (sorted(package - shipped), sorted(shipped - package))
    assert {name for name in package if not name.endswith(".py")} == {
        "cron_celery/py.typed", *(name for name in shipped if name.startswith("cron_celery/templates/"))}
    assert "cron_celery/py.typed" in package
    assert any(name.startswith("cron_celery/templates/admin/cron_celery/") for name in package)
    migrations = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "cron_celery" / "migrations").rglob("*.py"))
    assert "cron_celery/migrations/0001_initial.py" in migrations and all(name in package for name in migrations)
    assert {"after", "audit", "beat_sync", "counting"} <= {
        name.removeprefix("cron_celery/migrations/_initial/").removesuffix(".py") for name in package
        if name.startswith("cron_celery/migrations/_initial/")}
    assert names - package == {f"{DIST_INFO}/{part}" for part in
                               ("METADATA", "WHEEL", "RECORD", "top_level.txt", "licenses/LICENSE")}


def test_the_sdist_holds_the_sources_docs_monitoring_licence_and_changelog_but_not_the_tests(dist):
    with tarfile.open(dist.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"pyproject.toml", "LICENSE", "README.md", "README.pypi.md", "CHANGELOG.md", "mkdocs.yml",
            "docs/quickstart.md", "docs/reliability.md", "cron_celery/__init__.py", "cron_celery/py.typed"} <= names
    assert all(f"docs/{path.name}" in names for path in (ROOT / "docs").glob("*.md"))
    shipped = packaging.shipped_files()
    assert {name for name in shipped if name.startswith("deploy/")} <= names  # rules, dashboard
    assert not [name for name in names if name.startswith(("tests/", "bench/", "example/", "scripts/"))]
    assert not [name for name in names if name.endswith(".pyc") or "__pycache__" in name]


def test_the_metadata_a_user_reads(dist):
    meta = metadata(dist)
    assert meta["Name"] == "cron_celery" and meta["Version"] == __version__
    assert meta["License-Expression"] == "MIT" and meta.get_all("License-File") == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert meta["Requires-Python"] == ">=3.11"
    classifiers = set(meta.get_all("Classifier") or [])
    # Each Python the suite or the wheel test runs on (tests/packaging.py: user_python), each Django line.
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in (11, 12, 13)} <= classifiers
    assert {"Framework :: Django :: 5.2", "Framework :: Django :: 6.0", "Framework :: Celery",
            "Typing :: Typed"} <= classifiers
    assert not [c for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c)
                and int(c.rsplit(".", 1)[1]) not in (11, 12, 13)]
    requires = meta.get_all("Requires-Dist") or []
    assert any(line.startswith("Django") and "<6.1" in line and ">=5.2" in line for line in requires)
    base = [line.split(";")[0] for line in requires if "extra ==" not in line]
    assert not [line for line in base if line.lower().startswith(("sentry", "prometheus"))], base
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"prometheus", "sentry"} <= extras
    assert 'prometheus-client>=0.20; extra == "prometheus"' in requires
    assert 'sentry-sdk>=2.0; extra == "sentry"' in requires
    for url in meta.get_all("Project-URL") or []:  # none until the project has a public address
        assert url.split(", ", 1)[1].startswith("https://"), url


def test_the_long_description_has_no_link_that_breaks_outside_the_repository(dist):
    meta = metadata(dist)
    assert meta["Description-Content-Type"] == "text/markdown"
    description = str(meta.get_payload())
    assert description.strip() == (ROOT / PYPROJECT["project"]["readme"]).read_text(encoding="utf-8").strip()
    targets = LINK.findall(description) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", description, re.M)
    assert [target for target in targets if not target.startswith(("https://", "#"))] == []
    # What it says to install is what the wheel provides.
    for extra in re.findall(r'pip install "cron_celery\[(\w+)\]"', description):
        assert extra in (meta.get_all("Provides-Extra") or []), extra
    assert "Python 3.11 or later" in description  # what Requires-Python says


def test_the_link_checker_itself_catches_a_relative_link():
    assert LINK.findall("see [the quickstart](docs/quickstart.md) and ![x](img/a.png)") == [
        "docs/quickstart.md", "img/a.png"]
