"""The documentation site: ``mkdocs build --strict`` over docs/ (mkdocs.yml, the Material theme, the
API reference from the public API's docstrings) builds with no warning, every page of the navigation
is in it, and a broken link fails the build rather than being published."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = [sys.executable, "-m", "mkdocs"]
#: The public API the reference must show (cron_celery's ``__all__`` and the schedule builders).
PUBLIC = ("cron_celery.cron_task", "cron_celery.register_task", "cron_celery.TrackedTask", "cron_celery.Run",
          "cron_celery.lock", "cron_celery.JobFailed", "cron_celery.LeaseLost", "cron_celery.LockLost",
          "cron_celery.LockUnavailable", "cron_celery.ExecutionPattern", "cron_celery.schedules.cron",
          "cron_celery.schedules.every", "cron_celery.schedules.daily", "cron_celery.schedules.weekly",
          "cron_celery.schedules.monthly", "cron_celery.schedules.at", "cron_celery.schedules.at24")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MKDOCS, "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
                          cwd=config.parent, capture_output=True, text=True, timeout=300, check=False,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(site.parent)})


def nav_pages(config: Path) -> list[str]:
    return [next(iter(item.values())) for item in yaml.safe_load(config.read_text())["nav"]]


def test_the_site_builds_strict_with_every_page_and_the_api_reference(tmp_path: Path) -> None:
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    pages = nav_pages(ROOT / "mkdocs.yml")
    on_disk = sorted(path.name for path in (ROOT / "docs").glob("*.md"))
    assert sorted(pages) == on_disk, "every page of docs/ is in the navigation, and only those"
    for page in pages:
        built = tmp_path / "site" / ("index.html" if page == "index.md" else f"{page.removesuffix('.md')}/index.html")
        assert built.exists(), page
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in PUBLIC:
        assert f'id="{name}"' in api, f"the API reference does not show {name}"
    assert (tmp_path / "site" / "search" / "search_index.json").exists()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "project"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(ROOT / "cron_celery", copy / "cron_celery")
    page = copy / "docs" / "concepts.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [a page that is not there](no-such-page.md).\n",
                    encoding="utf-8")
    done = build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr
