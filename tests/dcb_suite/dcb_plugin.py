"""A pytest plugin (``-p dcb_plugin``) for django-celery-beat's own test suite, run by tests/test_dcb_suite.py.

What it changes in every mode, none of it in what their tests assert:

- their test file marks two fixtures ``django_db``; pytest 8 ignored such a mark (a mark on a
  fixture never had an effect) and pytest 9 refuses the file at import. Here it is ignored, as
  pytest 8 did, so their file runs unchanged on this project's pytest;
- their tests run as transactional tests (``django_db(transaction=True)``: each test's rows are
  removed after it, instead of one transaction rolled back). ``DatabaseScheduler`` calls Django's
  ``close_old_connections`` on every read and write, which closes a connection left in a transaction;
  inside a test's transaction that is the test's own connection. On SQLite's in-memory database,
  where their suite runs, Django ignores the close; on PostgreSQL the next query fails with
  "the connection is closed". Outside a test, a beat runs in autocommit, as here.

In the modes that test cron_celery's beat scheduler (``CRON_DCB_MODE`` ``tracked`` or
``none-chosen``) it puts ``cron_celery.beat.Scheduler`` where their tests take ``DatabaseScheduler``
from (``django_celery_beat.schedulers.DatabaseScheduler``), once Django is set up and before their
test module is imported: their ``TrackingScheduler`` then subclasses ours, and every scheduler their
tests make is ours.

At the end it writes to the JSON file ``CRON_DCB_REPORT`` names which tests were selected and
deselected, how each ended, which ``django_celery_beat`` was imported and which class their tests
took for ``DatabaseScheduler``; and, with cron_celery installed, every record of cron_celery's loggers
at WARNING or above with the test it came from: our scheduler logs and goes on where a beat must not
stop (a failed round, a failed read), so a test of theirs could pass over an error of ours.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest
from _pytest.fixtures import getfixturemarker
from _pytest.mark import structures

SWAPPED_MODES = frozenset({"tracked", "none-chosen"})

_store_mark = structures.store_mark


def _store_mark_but_on_fixtures(obj: Any, mark: Any, *args: Any, **kwargs: Any) -> None:
    if getfixturemarker(obj) is not None:
        return  # pytest 8: no effect
    _store_mark(obj, mark, *args, **kwargs)


structures.store_mark = _store_mark_but_on_fixtures


class Records(logging.Handler):
    """cron_celery's records at WARNING or above, each with the test that was running."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.test = "(outside any test)"
        self.found: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
        self.found.append({"test": self.test, "level": record.levelname, "logger": record.name, "message": text})


_records = Records()
_report: dict[str, Any] = {"deselected": [], "ran": {}}


def mode() -> str:
    return os.environ.get("CRON_DCB_MODE", "shipped")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    from django.apps import apps

    if not apps.ready:
        raise pytest.UsageError("dcb_plugin: Django is not set up (is pytest-django installed, with --ds?)")
    import django_celery_beat
    from django_celery_beat import schedulers

    if mode() != "shipped":
        logging.getLogger("cron_celery").addHandler(_records)
    if mode() in SWAPPED_MODES:
        from cron_celery.beat import Scheduler

        assert issubclass(Scheduler, schedulers.DatabaseScheduler)
        schedulers.DatabaseScheduler = Scheduler  # type: ignore[misc]
    taken = schedulers.DatabaseScheduler
    _report.update(mode=mode(), django_celery_beat=django_celery_beat.__file__,
                   scheduler=f"{taken.__module__}.{taken.__qualname__}")


def pytest_report_header(config: pytest.Config) -> str:
    return f"dcb mode {mode()}: their tests' DatabaseScheduler is {_report.get('scheduler')}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("django_db") is not None:
            item.add_marker(pytest.mark.django_db(transaction=True), append=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _records.test = item.nodeid
    try:
        return (yield)
    finally:
        _records.test = "(outside any test)"


def pytest_deselected(items: list[pytest.Item]) -> None:
    _report["deselected"].extend(item.nodeid for item in items)


def pytest_collection_finish(session: pytest.Session) -> None:
    _report["selected"] = [item.nodeid for item in session.items]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's outcome: failed when any of its phases failed (with that phase's error), skipped
    when it was skipped, else passed."""
    ran = _report["ran"].setdefault(report.nodeid, {"outcome": "passed", "error": ""})
    if report.failed and ran["outcome"] != "failed":
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else report.longreprtext
        ran.update(outcome="failed", error=f"{report.when}: {message}")
    elif report.skipped and ran["outcome"] == "passed":
        ran["outcome"] = "skipped"


def pytest_unconfigure(config: pytest.Config) -> None:
    """Write what ran, how it ended, and cron_celery's records, to the JSON file ``CRON_DCB_REPORT``."""
    path = os.environ.get("CRON_DCB_REPORT")
    if not path:
        return
    _report["records"] = _records.found
    with open(path, "w", encoding="utf-8") as out:
        json.dump(_report, out, indent=1)
