"""The docs stay true: every relative link and anchor in README.md and docs/ resolves, and
every setting and system check the code knows is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cron_celery import conf
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings."""
    found = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        found.add(slug)
    return found


def without_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_and_anchor_resolves(page: Path):
    text = without_code(page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text) + IMAGE.findall(text):
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.name}")
    assert not broken, f"{page.name}: {broken}"


def test_every_setting_is_in_the_configuration_reference():
    reference = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [name for name in conf.FIELDS if f"`{name}" not in reference]
    assert not missing, f"settings missing from docs/configuration.md: {missing}"


def test_every_system_check_id_is_documented():
    code = "".join(path.read_text(encoding="utf-8") for path in (ROOT / "cron_celery").glob("*.py"))
    ids = sorted(set(re.findall(r"cron_celery\.[EW]\d{3}", code)))
    docs = "".join(page.read_text(encoding="utf-8") for page in PAGES)
    assert ids and not [check for check in ids if check not in docs]
