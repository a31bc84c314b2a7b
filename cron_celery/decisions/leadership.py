"""Named leases on the database clock: which beat leads, which worker runs the reconciler's pass.

A lease is one ``Lease`` row. Whoever wrote its ``token`` holds it until ``lease_until``, and
both that time and "has it run out" are PostgreSQL's ``now()``, never a process's clock, so
machines whose clocks disagree still agree on who holds it. Taking and renewing are one
statement that succeeds only for the holder or once the lease has run out; releasing ends it
at once, so a waiting process takes it at its next try instead of waiting for it to run out.

Every call is a single autocommit statement and keeps no state in the database session (no
advisory lock, ``SET`` or ``LISTEN``), so it works behind a connection pooler in transaction
mode, where consecutive statements may reach different server connections.
"""

from __future__ import annotations

import datetime as dt

from django.db import connection

from cron_celery import models

LEASE = models.Lease._meta.db_table
#: A row (not a lease) whose ``lease_until`` is when the last reconciler pass that finished every
#: step ended (``mark``): a pass that raised does not move it (``metrics`` reads it).
RECONCILED = "reconciler-done"
#: A row (not a lease) whose ``lease_until`` is when a reconciler pass last could not ask the broker
#: where the stranded executions' messages are, and left them alone (``metrics`` serves it).
BROKER_UNANSWERED = "reconciler-broker-unanswered"


def hold(name: str, token: str, holder: str, seconds: float) -> bool:
    """Take the lease ``name`` for ``seconds``, or renew it if ``token`` holds it; returns
    whether ``token`` holds it now."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {LEASE} AS lease (name, holder, token, lease_until, since)
            VALUES (%(name)s, %(holder)s, %(token)s, now() + make_interval(secs => %(seconds)s), now())
            ON CONFLICT (name) DO UPDATE
               SET holder = EXCLUDED.holder, token = EXCLUDED.token, lease_until = EXCLUDED.lease_until,
                   since = CASE WHEN lease.token = EXCLUDED.token THEN lease.since ELSE EXCLUDED.since END
             WHERE lease.token = EXCLUDED.token OR lease.lease_until <= now()
            RETURNING true
            """,
            {"name": name, "holder": holder[:200], "token": token, "seconds": float(seconds)},
        )
        return cursor.fetchone() is not None


def release(name: str, token: str) -> bool:
    """End the lease now if ``token`` holds it; returns whether it did."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {LEASE} SET lease_until = now() WHERE name = %s AND token = %s AND lease_until > now()",
                       [name, token])
        return bool(cursor.rowcount == 1)


def mark(name: str, holder: str) -> None:
    """Record that ``name`` happened now (the database's clock), by ``holder``: a row of the lease
    table that nobody holds, only read for its time."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {LEASE} AS lease (name, holder, token, lease_until, since)
            VALUES (%(name)s, %(holder)s, '', now(), now())
            ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until
            """,
            {"name": name, "holder": holder[:200]},
        )


def holder(name: str) -> str | None:
    """Who holds the lease ``name`` now (host:pid), or None when nobody does."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT holder FROM {LEASE} WHERE name = %s AND lease_until > now()", [name])
        row = cursor.fetchone()
    return str(row[0]) if row else None


def database_now() -> dt.datetime:
    """The database's clock: what every "is it late" decision of the reconciler compares with."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        row = cursor.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]
