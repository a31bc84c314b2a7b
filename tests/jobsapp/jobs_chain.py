"""Jobs that run after each other (``after=``; tests/faults/test_dependencies.py): extract and
transform, then load once both succeeded in a slot. With CRON_TEST_DIE_AFTER_UPSTREAM set, a
worker kills itself (its whole process group) when transform's success has been committed and
announced — after the downstream execution was recorded, before it was sent.

chain-fails always fails, and chain-after-fails (``alert_on_upstream=True``) is skipped each time
and alerts; with CRON_TEST_DIE_AFTER_UPSTREAM_FAILURE set, a worker kills itself when chain-fails'
failure has been committed and announced — after the skip and its alert were recorded."""

from __future__ import annotations

import os
from typing import Any

from django.dispatch import receiver

from cron_celery import Run, cron_task
from cron_celery.alerts.signals import execution_failed, execution_succeeded
from tests.jobsapp.tasks import mark


@cron_task(name="chain-extract", code="C101", pattern="always", overlap="allow")
def chain_extract(run: Run) -> str:
    mark(run, "chain-extract")
    return "extracted"


@cron_task(name="chain-transform", code="C102", pattern="always", overlap="allow")
def chain_transform(run: Run) -> str:
    mark(run, "chain-transform")
    return "transformed"


@cron_task(name="chain-load", code="C103", after=["chain-extract", "chain-transform"])
def chain_load(run: Run) -> str:
    """Runs each slot once both upstream jobs succeeded in it."""
    mark(run, "chain-load")
    return "loaded"


@receiver(execution_succeeded)
def _die_after_upstream(sender: object = None, **kwargs: Any) -> None:
    if kwargs.get("job") == "chain-transform" and os.environ.get("CRON_TEST_DIE_AFTER_UPSTREAM"):
        os.killpg(os.getpgid(0), 9)  # the whole worker, between the committed success and the send


@cron_task(name="chain-fails", code="C104", pattern="always", overlap="allow")
def chain_fails(run: Run) -> str:
    mark(run, "chain-fails")
    raise RuntimeError("the source is down")


@cron_task(name="chain-after-fails", code="C105", after="chain-fails", alert_on_upstream=True)
def chain_after_fails(run: Run) -> str:
    """Never runs: its upstream always fails, and it is alerted of each skip."""
    mark(run, "chain-after-fails")
    return "ran"


@receiver(execution_failed)
def _die_after_upstream_failure(sender: object = None, **kwargs: Any) -> None:
    if kwargs.get("job") == "chain-fails" and os.environ.get("CRON_TEST_DIE_AFTER_UPSTREAM_FAILURE"):
        os.killpg(os.getpgid(0), 9)  # the whole worker, right after the committed failure
