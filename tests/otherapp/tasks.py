"""The tasks of the app of someone else's (see the package's doc): each marks its body in the file
named by ``CRON_TEST_MARKER``, when set, with its label, the time and the pid."""

from __future__ import annotations

import os
import time
from typing import Any

import celery
from asgiref.sync import async_to_sync
from celery import shared_task

from tests.celery_app import app


def _mark(text: str) -> None:
    path = os.environ.get("CRON_TEST_MARKER")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{text} {time.time():.3f} {os.getpid()}\n")


class Audited(celery.Task):  # type: ignore[type-arg]
    """A base class of the app's own: its ``__call__`` notes each call before the body."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls = getattr(self, "calls", 0) + 1
        return super().__call__(*args, **kwargs)


@shared_task(bind=True, base=Audited, name="tests.otherapp.tasks.audited")
def audited(self: Audited, label: str) -> str:
    _mark(f"other-audited {label}")
    return f"{label} audited (call {self.calls} of this process)"


class Rollup(celery.Task):  # type: ignore[type-arg]
    """A class-based task, registered on the app."""

    name = "tests.otherapp.tasks.rollup"

    def run(self, label: str, *, size: int = 1) -> dict[str, Any]:
        _mark(f"other-rollup {label}")
        return {"label": label, "rows": size}


rollup = app.register_task(Rollup())


async def _fetch(label: str) -> str:
    return f"{label} fetched"


@shared_task(name="tests.otherapp.tasks.fetch")
def fetch(label: str) -> str:
    """An async function run through asgiref's ``async_to_sync``."""
    value = async_to_sync(_fetch)(label)
    _mark(f"other-fetch {label}")
    return value
