"""The docs stay true: every relative link and anchor in README.md and docs/ resolves; every
setting (with its default), system check, module, management command, model field and Sentry
option the code knows is documented; and every test a page names exists. The quickstart's
code is run by tests/test_quickstart.py."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from cron_celery import conf
from tests.conftest import ROOT

pytestmark = pytest.mark.pure  # needs neither PostgreSQL nor Redis

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


# --- the tests the pages name ---------------------------------------------------------------

TEST_REF = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")
TEST_NAME = re.compile(r"`(test_\w+)`")


def _defined(path: Path) -> set[str]:
    return set(re.findall(r"^(?:async )?def (test_\w+)\(", path.read_text(encoding="utf-8"), flags=re.M))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_test_a_page_names_exists(page: Path):
    text = page.read_text(encoding="utf-8")
    everywhere = set().union(*(_defined(path) for path in (ROOT / "tests").rglob("test_*.py")))
    missing = []
    for path, name in TEST_REF.findall(text):
        if not (ROOT / path).is_file():
            missing.append(f"{path}: no such file")
        elif name and name not in _defined(ROOT / path):
            missing.append(f"{path}::{name}: no such test")
    missing += [f"{name}: no such test" for name in TEST_NAME.findall(text) if name not in everywhere]
    assert not missing, f"{page.name}: {missing}"


def test_every_guarantee_in_reliability_names_the_test_that_proves_it():
    """Each row of a table whose header says "proven by" names at least one test function."""
    rows = []
    header = False
    for line in (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            header = False
        elif "proven by" in line:
            header = True
        elif header and not line.startswith("|---"):
            rows.append(line)
    assert len(rows) >= 20
    unproven = [row[:80] for row in rows if not re.search(r"`tests/[\w/]+\.py::test_\w+`", row)]
    assert not unproven, unproven


# --- the code the pages describe ------------------------------------------------------------

def test_the_configuration_reference_gives_every_default_as_the_code_has_it():
    reference = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(CRON_CELERY = \{.*?\n\})\n```", reference, flags=re.S)
    assert block is not None, "configuration.md lost its block of defaults"
    namespace: dict[str, object] = {}
    exec(block.group(1), namespace)
    assert namespace["CRON_CELERY"] == dataclasses.asdict(conf.Settings())
    rows = {}
    for key, sub, default, checked in re.findall(
            r'^\| `([A-Z_]+)(?:\["(\w+)"\])?` \| `([^`]+)` \| .* \| ([^|]+) \|$', reference, flags=re.M):
        rows[(key, sub)] = (ast.literal_eval(default), checked)
    expected = {}
    for name, value in dataclasses.asdict(conf.Settings()).items():
        if isinstance(value, dict):
            expected.update({(name, sub): item for sub, item in value.items()})
        else:
            expected[(name, "")] = value
    assert {key: rows[key][0] for key in expected if key in rows} == expected
    for key, (_default, checked) in rows.items():
        assert "cron_celery." in checked or checked.strip().startswith("none"), (key, checked)


def test_architecture_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    package = ROOT / "cron_celery"
    modules = [path for path in package.rglob("*.py") if "migrations" not in path.parts
               and path.name != "__init__.py"] + [package / "__init__.py"]
    missing = [str(path.relative_to(package)) for path in modules if f" {path.name} " not in text
               and f"  {path.name}" not in text]
    assert not missing, f"docs/architecture.md does not name {missing}"
    for folder in ("notifiers/", "management/commands/", "migrations/", "templates/"):
        assert folder in text


def test_every_management_command_a_page_names_exists_and_each_is_documented():
    from django.core.management import get_commands

    commands = get_commands()
    ours = sorted(path.stem for path in (ROOT / "cron_celery" / "management" / "commands").glob("[a-z]*.py"))
    named = set()
    for page in PAGES:
        named |= set(re.findall(r"manage\.py (\w+)", page.read_text(encoding="utf-8")))
    hypothetical = {"nightly_export"}  # the user's own command in migrating.md
    assert not [name for name in named - hypothetical if name not in commands]
    reference = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    assert ours and not [name for name in ours if f"`{name}`" not in reference]


def test_every_sentry_option_is_documented():
    code = (ROOT / "cron_celery" / "alerts" / "sentry.py").read_text(encoding="utf-8")
    options = set(re.findall(r'options\(\)\.get\("(\w+)"', code))
    page = (ROOT / "docs" / "sentry.md").read_text(encoding="utf-8")
    assert options and not [name for name in options if f"| `{name}` |" not in page]


def test_concepts_names_every_field_of_jobs_and_executions():
    from cron_celery.models import CronExecution, CronJob

    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    for model in (CronJob, CronExecution):
        fields = [field.name for field in model._meta.concrete_fields if field.name != "id"]
        assert not [name for name in fields if f"`{name}`" not in text], model.__name__


def test_the_index_lists_the_pages_in_the_sites_order():
    """docs/index.md names each page once, in the order of the site's navigation (mkdocs.yml)."""
    nav = re.findall(r"^  - [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.MULTILINE)
    listed = re.findall(r"^- \[[^\]]+\]\(([^)#]+\.md)\)", (ROOT / "docs" / "index.md").read_text(encoding="utf-8"),
                        re.MULTILINE)
    assert listed == [page for page in nav if page != "index.md"], listed
    assert sorted(nav) == sorted(path.name for path in (ROOT / "docs").glob("*.md")), nav


def test_the_quickstart_names_every_action_of_the_jobs_dashboard():
    from django.contrib import admin as django_admin

    from cron_celery.models import CronJob

    page = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    dashboard = django_admin.site._registry[CronJob]
    for name in map(str, dashboard.actions or ()):
        shown = getattr(dashboard, name).short_description.split(" (")[0]
        assert f"*{shown}*" in " ".join(page.split()), shown
