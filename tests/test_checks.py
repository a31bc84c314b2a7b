"""System checks: bad configuration is reported at start-up with stable ids."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings
from django.test import override_settings

from cron_celery import check_errors, checks
from tests.conftest import ROOT, subprocess_env


def ids(messages):
    return [message.id for message in messages]


def test_a_clean_configuration_passes():
    assert checks.check_settings() == []
    assert checks.check_connection_reuse() == []
    assert checks.check_tokens() == []


@override_settings(CRON_CELERY={"LEASE_SECOND": 30})
def test_an_unknown_key_is_an_error_naming_the_known_ones():
    (error,) = checks.check_settings()
    assert error.id == "cron_celery.E001" and "'LEASE_SECOND'" in error.msg
    assert error.hint.startswith("Did you mean 'LEASE_SECONDS'? Known keys: "), error.hint


@override_settings(CRON_CELERY={"LEASE_SECONDS": 1, "MESSAGE_MAX_CHARS": "many", "CATCH_UP_LIMIT": 0})
def test_bad_numbers_are_errors():
    assert ids(checks.check_settings()) == ["cron_celery.E002"] * 3


@override_settings(CRON_CELERY={"DEFAULT_PATTERN": "sometimes", "DEFAULT_TIMEZONE": "Nowhere/Land"})
def test_bad_defaults_are_errors():
    assert ids(checks.check_settings()) == ["cron_celery.E003", "cron_celery.E004"]


@override_settings(CELERY_DB_REUSE_MAX=None)
def test_a_missing_connection_reuse_setting_is_a_warning(monkeypatch):
    from celery import current_app

    monkeypatch.setitem(current_app.conf, "db_reuse_max", None)
    monkeypatch.setitem(current_app.conf, "CELERY_DB_REUSE_MAX", None)
    assert ids(checks.check_connection_reuse()) == ["cron_celery.W001"]


@override_settings(CRON_CELERY={"LOCK": {"MASTERS": ["redis://a:6379/0", "redis://b:6379/0"]}})
def test_two_lock_masters_are_refused():
    (error,) = checks.check_lock()
    assert error.id == "cron_celery.E006" and "2 Redis masters" in error.msg


@override_settings(CRON_CELERY={"LOCK": {"MASTERS": "redis://a:6379/0", "TTL": 0}})
def test_lock_masters_must_be_a_list_of_urls_and_ttl_positive():
    assert ids(checks.check_lock()) == ["cron_celery.E005", "cron_celery.E007"]


@override_settings(CRON_CELERY={"LEASE_SECONDS": 30, "LOCK": {"TTL": 60, "MASTER": []}})
def test_a_lock_ttl_longer_than_the_lease_and_unknown_lock_keys_are_errors():
    errors = checks.check_lock()
    assert ids(errors) == ["cron_celery.E005", "cron_celery.E007"]
    assert "longer than LEASE_SECONDS" in errors[1].msg


THREE = ["redis://a:6379/0", "redis://b:6379/0", "redis://c:6379/0"]


@override_settings(CRON_CELERY={"LOCK": {"MASTERS": THREE, "TTL": 30}})
def test_three_masters_pass():
    assert checks.check_lock() == []


# --- API tokens (docs/operations.md#tokens) --------------------------------------------------

GOOD = "good-token-0123456789-abcdefghijklmn"


def test_api_tokens_that_are_short_duplicated_or_badly_scoped_are_errors_that_never_show_the_value():
    values = {
        "ok": {"token": GOOD, "scopes": ["read"]},
        "short": {"token": "s3cret-but-short", "scopes": ["read"]},
        "twin-a": {"token": "twin-token-0123456789-abcdefghijklmn", "scopes": ["read"]},
        "twin-b": {"token": "twin-token-0123456789-abcdefghijklmn", "scopes": ["run"]},
        "scoped": {"token": "scoped-token-0123456789-abcdefghijkl", "scopes": ["read", "write"]},
        "empty": {"token": "empty-token-0123456789-abcdefghijklm", "scopes": []},
        "typo": {"tokn": "x", "scopes": ["read"]},
        "bad name!": {"token": "named-token-0123456789-abcdefghijklm", "scopes": ["read"]},
    }
    with override_settings(CRON_CELERY={"API_TOKENS": values}):
        found = checks.check_tokens()
    assert set(ids(found)) == {"cron_celery.E014"}
    text = "\n".join(message.msg for message in found)
    assert "['short']['token'] is shorter than 32 characters" in text
    assert "The API tokens 'twin-a', 'twin-b' have the same value" in text
    assert "['scoped']['scopes'] has unknown scopes ['write']" in text
    assert "['empty']['scopes'] is empty" in text
    assert "['typo'] has unknown keys ['tokn']" in text and "['typo']['token'] must be a non-empty string" in text
    assert "a name 'bad name!'" in text
    assert len(found) == 7
    for entry in values.values():
        assert str(entry.get("token")) not in text
    with override_settings(CRON_CELERY={"API_TOKENS": ["not", "a", "dict"]}):
        assert ids(checks.check_tokens()) == ["cron_celery.E014"]


def test_the_deprecated_api_token_is_a_warning_that_says_what_to_write_instead():
    with override_settings(CRON_CELERY={"API_TOKEN": "legacy-token-0123456789"}):
        (warning,) = checks.check_tokens()
        assert checks.check_operations() == []
    assert warning.id == "cron_celery.W002" and warning.level == checks.checks.WARNING
    assert "'scopes': ['read', 'run', 'force']" in warning.msg and "legacy-token" not in warning.msg
    with override_settings(CRON_CELERY={"API_TOKEN": "short"}):  # its old rule still stands
        assert ids(checks.check_operations()) == ["cron_celery.E013"]


# --- workers and beats refuse to start on an error ------------------------------------------

def start_refused(*command: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.celery_app", *command],
                          cwd=ROOT, env=subprocess_env(**env), capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.django_db
@pytest.mark.parametrize("command", [
    ("worker", "--pool", "solo", "--without-gossip", "--without-mingle", "--without-heartbeat"),
    ("beat", "-S", "cron_celery.beat.Scheduler"),
], ids=["worker", "beat"])
def test_a_worker_or_beat_with_a_check_error_refuses_to_start(command: tuple[str, ...]):
    # A lock TTL longer than the lease: a crashed worker's lock would outlive its claim.
    result = start_refused(*command, CRON_TEST_LOCK_TTL="120", CRON_TEST_LEASE_SECONDS="60")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"cron_celery: the {command[0]} refuses to start" in result.stderr
    assert "cron_celery.E007" in result.stderr and "HINT: Keep the lock TTL at or below the lease" in result.stderr
    assert "ready." not in result.stdout + result.stderr  # it never consumed a message


def test_a_silenced_check_does_not_stop_a_worker():
    with override_settings(CRON_CELERY={**settings.CRON_CELERY, "LOCK": {"TTL": 120}, "LEASE_SECONDS": 60}):
        with pytest.raises(SystemExit):
            check_errors.refuse_to_start("worker")
        with override_settings(SILENCED_SYSTEM_CHECKS=["cron_celery.E007"]):
            check_errors.refuse_to_start("worker")  # returns: the operator chose to run with it
    check_errors.refuse_to_start("worker")  # the test settings are clean


def test_every_hint_names_a_page_and_anchor_the_documentation_has():
    """A hint sends a wheel's user to a page they can open: its title and its file in the docs that
    travel with the source distribution, with an anchor the page has."""
    import re

    from tests.conftest import ROOT
    from tests.test_docs import anchors as anchors_of

    for page, title in checks.PAGES.items():
        text = (ROOT / "docs" / f"{page}.md").read_text(encoding="utf-8")
        assert text.startswith(f"# {title}"), (page, title)
    source = (ROOT / "cron_celery" / "checks.py").read_text(encoding="utf-8")
    for page, anchor in re.findall(r'see\("(\w+)"(?:, "([\w-]+)")?\)', source):
        assert page in checks.PAGES, page
        if anchor:
            doc = ROOT / "docs" / f"{page}.md"
            assert anchor in anchors_of(doc) or f'id="{anchor}"' in doc.read_text(encoding="utf-8"), (page, anchor)
    assert "docs/" not in source.replace("docs/{page}", "").replace("(docs/)", "").replace(
        "docs/reliability.md", ""), "a hint that names a docs/ path by hand"
