"""The documentation site: ``mkdocs build --strict`` over docs/ (mkdocs.yml, the Material theme, the
API reference from the public API's docstrings) builds with no warning, every page of the navigation
is in it, and a broken link fails the build rather than being published."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
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


class DocTexts(HTMLParser):
    """The prose mkdocstrings wrote for each object of a page: the text of the paragraphs and list items
    of its ``doc-contents`` block (not its "Bases:" line, not the blocks of its members, which are
    objects of their own), by the id of its heading; ``plain`` leaves out what is in code."""

    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
                      "track", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[str, str] = {}
        self.plain: dict[str, str] = {}
        # (tag, the object it documents, in a paragraph or list item, in code)
        self.stack: list[tuple[str, str | None, bool, bool]] = []
        self.heading: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        found = dict(attrs)
        classes = (found.get("class") or "").split()
        owner = None
        if "doc-heading" in classes and found.get("id"):
            self.heading = found["id"]
        elif tag == "div" and "doc-contents" in classes and self.heading:
            owner, self.heading = self.heading, None
            self.texts.setdefault(owner, "")
            self.plain.setdefault(owner, "")
        elif tag == "div" and "doc-children" in classes:
            owner = ""  # the members' own blocks: no one's prose until a member's doc-contents
        inside = self.stack[-1] if self.stack else ("", None, False, False)
        prose = (tag in ("p", "li") and "doc-class-bases" not in classes) or inside[2]
        self.stack.append((tag, owner, prose, tag in ("code", "pre") or inside[3]))

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if not self.stack or not self.stack[-1][2]:
            return
        owner = next((frame[1] for frame in reversed(self.stack) if frame[1] is not None), "")
        if owner:
            self.texts[owner] += data
            if not self.stack[-1][3]:
                self.plain[owner] += data


def doc_texts(page: str) -> tuple[dict[str, str], dict[str, str]]:
    """Each object's prose on the page, and the same without its code."""
    parser = DocTexts()
    parser.feed(page)
    parser.close()
    return parser.texts, parser.plain


#: A message template published as a docstring: ``{name!r}``, ``{job}``.
TEMPLATE_FIELD = re.compile(r"\{\w+(![rsa])?(:[^{}]*)?\}")


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
    texts, plain = doc_texts(api)
    assert set(PUBLIC) <= set(texts), sorted(set(PUBLIC) - set(texts))
    # Every object the page shows (the public names and the members it lists, e.g. TrackedTask.execute)
    # says something: a heading and a signature alone are no documentation, and a message template
    # (an exception whose docstring is its message) is not prose either.
    empty = sorted(name for name, text in texts.items() if len(re.findall(r"[A-Za-z]{2,}", text)) < 3)
    assert not empty, f"the API reference shows these with no docstring text: {empty}"
    templates = {name: text for name, text in plain.items() if TEMPLATE_FIELD.search(text)}
    assert not templates, f"the API reference shows message templates as docstrings: {templates}"


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
