"""A claim or a final write carried through a database that went away: the session ended by the
server (a restart, a failover) is reconnected and the statement sent again, for at least
``RECONNECT_SECONDS``; anything else is raised at once."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connection

from cron_celery import conf

logger = logging.getLogger(__name__)

T = TypeVar("T")


#: How long a claim or a final write keeps trying to reach a database that went away (at least).
RECONNECT_SECONDS = 60.0

#: SQLSTATEs of a session the server ended: admin_shutdown, crash_shutdown, cannot_connect_now.
_ENDED_SESSION = ("57P01", "57P02", "57P03")


def reconnected(error: Exception, deadline: float, pause: float) -> bool:
    """After a failed statement outside any transaction: True when the connection itself was
    lost (the server restarted, or ended this session: no SQLSTATE, class 08, or 57P01-03;
    never a statement's own error such as a deadlock or a timeout) and there is time left to
    try again. A broken connection is closed first, so the next statement opens a new one.
    Inside a transaction (an in-process call in a test case's transaction) nothing is tried again."""
    if connection.in_atomic_block:
        return False
    state = getattr(error.__cause__, "sqlstate", None)
    if not (isinstance(error, InterfaceError) or state is None or state.startswith("08") or state in _ENDED_SESSION):
        return False
    with contextlib.suppress(Exception):
        if not connection.is_usable():  # Django may already have opened a new one (leaving an atomic block)
            connection.close()
    if time.monotonic() + pause > deadline:
        return False
    time.sleep(pause)
    return True


def reconnecting(write: Callable[[], T], what: str, extra: dict[str, object]) -> tuple[T, bool]:
    """``write()``, tried again on a new connection while the database is unreachable, for up to
    ``RECONNECT_SECONDS`` (a minute, or two leases when they are longer). Past the lease the
    write is still worth trying: until the reconciler has ended the run, the fenced write lands
    and nothing is lost; once it has (or another run of an exclusive job superseded this one),
    the fence refuses it. Returns its value and whether it was tried more than once. Only for
    statements that are safe to repeat: a claim of an existing execution and the fenced writes
    (a repeat matches no row once the first one was committed)."""
    deadline = time.monotonic() + max(RECONNECT_SECONDS, 2 * conf.settings.LEASE_SECONDS)
    pause, retried = 0.2, False
    while True:
        try:
            return write(), retried
        except (OperationalError, InterfaceError) as error:
            if not reconnected(error, deadline, pause):
                raise
            logger.warning("lost the database while %s (%s); trying again on a new connection", what,
                           str(error).strip()[:200], extra=extra)
            pause, retried = min(2.0, pause * 2), True
