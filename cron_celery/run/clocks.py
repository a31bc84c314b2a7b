"""When a message sent now is due, on the database's clock rather than this process's.

A retry's countdown and a ``delay()`` that names no slot used to be read against the sending
process's clock: a worker whose clock runs two hours ahead sent its retries two hours late for every
other worker, and a caller's skewed clock named the wrong minute as the slot. Every other "when" of
the package (leases, due slots, the reconciler's judgements) is the database's ``now()``; messages
follow it too. ``clock_timestamp()``, not ``now()``: a caller inside a long transaction of its own
gets this instant, not the transaction's start.

When the database cannot be asked (down, or no access in a caller's own tests), this process's
clock is used and a warning says so: a message is never refused for it.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.db import connection

logger = logging.getLogger(__name__)


def now() -> dt.datetime:
    """The database's clock this instant (aware, UTC); this process's when it cannot be read."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            row = cursor.fetchone()
    except Exception as error:  # any failure to ask: a message is still sent, on this clock
        logger.warning("could not read the database's clock (%s: %s); using this process's clock",
                       type(error).__name__, str(error).strip()[:200])
        return dt.datetime.now(dt.UTC)
    assert row is not None
    return row[0].astimezone(dt.UTC)  # type: ignore[no-any-return]


def eta(countdown: float) -> dt.datetime:
    """The moment ``countdown`` seconds from now on the database's clock: a message's ``eta``."""
    return now() + dt.timedelta(seconds=max(0.0, float(countdown)))
