"""cron_celery: periodic Celery jobs for Django that run exactly once per scheduled slot."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "ExecutionPattern",
    "JobFailed",
    "LeaseLost",
    "LockLost",
    "LockUnavailable",
    "PreviousRun",
    "Run",
    "TrackedTask",
    "__version__",
    "cron_task",
    "lock",
    "register_task",
]

if TYPE_CHECKING:
    from cron_celery.decisions.previous import PreviousRun
    from cron_celery.enums import ExecutionPattern
    from cron_celery.exceptions import JobFailed, LeaseLost, LockLost, LockUnavailable
    from cron_celery.run.decorators import cron_task, register_task
    from cron_celery.run.locks import lock
    from cron_celery.run.runs import Run
    from cron_celery.run.tasks import TrackedTask

_LAZY = {
    "ExecutionPattern": "cron_celery.enums",
    "JobFailed": "cron_celery.exceptions",
    "LeaseLost": "cron_celery.exceptions",
    "LockLost": "cron_celery.exceptions",
    "LockUnavailable": "cron_celery.exceptions",
    "PreviousRun": "cron_celery.decisions.previous",
    "lock": "cron_celery.run.locks",
    "Run": "cron_celery.run.runs",
    "TrackedTask": "cron_celery.run.tasks",
    "cron_task": "cron_celery.run.decorators",
    "register_task": "cron_celery.run.decorators",
}


def __getattr__(name: str) -> Any:
    # Lazy, so that Django can import the package before its models are ready.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cron_celery' has no attribute {name!r}")
