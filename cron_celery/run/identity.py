"""Who runs an attempt, as its execution records it (``worker``): this host and this process's boot.

``BOOT`` is random, made once when the module is first imported. A worker's main process imports
it before it forks its pool, so its pool processes share it; another worker, even on a host of the
same name (containers with host networking), has its own. Pids repeat across pid namespaces: with
the boot, a worker's parent that saw its child die, or revokes its task, never takes another
worker's run for its own (``parent``).
"""

from __future__ import annotations

import secrets
import socket

HOSTNAME = socket.gethostname()
BOOT = secrets.token_hex(4)
#: The readable host, then ``#`` and the boot: ``web-1#3fa85f64`` (a host name holds no ``#``).
WORKER = f"{HOSTNAME}#{BOOT}"
