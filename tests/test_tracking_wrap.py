"""Every worker wraps the tasks it knows (``tracking.worker.install``), whatever their class does: a
``run`` the instance cannot take (a read-only property) gets a class of its own; a task that takes
neither is named loudly in the worker's log, and every other task is wrapped all the same. A
message without the ``cron_job`` header runs the task's own body, unchanged. Pure logic: a Celery app
of the test's own, no broker, no database."""

from __future__ import annotations

import logging
from typing import Any

import celery
import pytest

from cron_celery.run import tasks
from cron_celery.tracking import worker


class Frozen(celery.Task):  # type: ignore[type-arg]
    """A task whose ``run`` is a read-only property."""

    name = "wrap.frozen"

    @property
    def run(self) -> Any:  # type: ignore[override]
        return self.double

    def double(self, value: int) -> int:
        return value * 2


class Locked(Frozen):
    """A task that refuses every new attribute and class: it cannot be wrapped."""

    name = "wrap.locked"

    def __setattr__(self, key: str, value: Any) -> None:
        if key in ("run", "retry", "__class__"):
            raise AttributeError(f"{key} is locked")
        super().__setattr__(key, value)


@pytest.fixture
def app() -> Any:
    found = celery.Celery("wrap-tests", set_as_current=False)

    @found.task(name="wrap.plain", bind=True)
    def plain(self: Any, value: int) -> int:
        return value + 1

    found.register_task(Frozen())
    found.register_task(Locked())
    return found


def test_a_task_whose_run_is_read_only_gets_a_class_of_its_own_and_one_that_refuses_is_named(app, caplog):
    with caplog.at_level(logging.ERROR, logger="cron_celery.tracking.worker"):
        wrapped, refused = worker.install(app)
    assert refused == ["wrap.locked"]
    assert wrapped == sum(1 for task in app.tasks.values() if not isinstance(task, tasks.TrackedTask)) - 1
    frozen, plain = app.tasks["wrap.frozen"], app.tasks["wrap.plain"]
    assert getattr(frozen.run, worker.WRAPPED) and getattr(plain.run, worker.WRAPPED)
    assert isinstance(frozen, Frozen) and type(frozen) is not Frozen and type(frozen).__qualname__ == "Frozen"
    assert frozen.run(3) == 6 and plain.run(3) == 4  # no cron_job header: the task's own body
    assert frozen(5) == 10  # called as Celery calls it
    assert not getattr(app.tasks["wrap.locked"].run, worker.WRAPPED, False)
    (record,) = [r for r in caplog.records if "wrap.locked" in r.getMessage()]
    assert "cannot be wrapped" in record.getMessage() and "without its slot claimed" in record.getMessage()
    assert worker.install(app) == (0, ["wrap.locked"])  # a second install wraps nothing twice
