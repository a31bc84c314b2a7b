"""The soft time limit, held off while a finished run's outcome is written.

With the prefork pool, billiard raises ``SoftTimeLimitExceeded`` in the child from its
``SIGUSR1`` handler, wherever the child happens to be. Once the job's body has returned or
raised, the limit no longer concerns it; landing inside the outcome write it would roll the
write back (or leave the statement running on a connection nobody reads), and the finished
body would be run again later. ``hold`` swaps billiard's handler for one that only notes the
signal; ``release`` puts it back and logs a limit that landed in between.

Only billiard's own handler is held: in any other process (a solo worker, ``run_cron_task``)
nothing changes.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
from typing import Any

from billiard.pool import soft_timeout_sighandler

logger = logging.getLogger(__name__)
SIGNAL = getattr(signal, "SIGUSR1", None)


@dataclasses.dataclass(kw_only=True)
class Hold:
    """A held soft limit: the handler to put back, and whether the limit landed meanwhile."""

    previous: Any = None
    landed: bool = False

    def note(self, signum: int, frame: Any) -> None:
        self.landed = True


#: ``release`` of this does nothing (nothing was held).
NOT_HELD = Hold()


def hold() -> Hold:
    """Hold the soft time limit off in this process until ``release``."""
    if SIGNAL is None or threading.current_thread() is not threading.main_thread():
        return NOT_HELD
    if signal.getsignal(SIGNAL) is not soft_timeout_sighandler:
        return NOT_HELD
    held = Hold(previous=soft_timeout_sighandler)
    signal.signal(SIGNAL, held.note)
    return held


def release(held: Hold, extra: dict[str, object] | None = None) -> None:
    """Put the soft limit's handler back; a limit that landed while held is only logged (the
    body it was meant for had already ended)."""
    if held is NOT_HELD or SIGNAL is None:
        return
    signal.signal(SIGNAL, held.previous)
    if held.landed:
        logger.warning("the soft time limit was reached while the outcome was being written; the job had "
                       "already ended, so the outcome stands", extra=extra)
