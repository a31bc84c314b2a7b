"""Whether the caller's database connection lets an in-process run in: never inside a transaction
of the caller's own (``transaction.atomic()``, ``ATOMIC_REQUESTS``, autocommit turned off), where
the run's claim would stay uncommitted, holding the job's row locked, for the whole run; only
inside the transaction a test case wraps each test in."""

from __future__ import annotations

from django.db import connection

from cron_celery import exceptions


def in_test_transaction() -> bool:
    """The connection is inside the transaction a test case wraps each test in (Django's
    ``TestCase``, pytest-django's ``db``), and in no transaction of the caller's own: the one
    transaction an in-process run may run inside (Django lets a durable block in there too)."""
    blocks = connection.atomic_blocks
    return bool(blocks) and all(getattr(block, "_from_testcase", False) for block in blocks)


def refuse_in_transaction(job: str) -> None:
    """Raise ``RunInTransaction`` for job ``job`` (its name) when the caller's connection is inside a
    transaction of its own. A test case's transaction is let through."""
    if connection.in_atomic_block:
        inside = not in_test_transaction()
    else:  # autocommit turned off by hand: a transaction without an atomic block
        inside = connection.connection is not None and not connection.get_autocommit()
    if inside:
        raise exceptions.RunInTransaction(job=job)
