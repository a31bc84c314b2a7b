"""The soak's alert channel: every delivery is a line in a file the checker reads."""

from __future__ import annotations

import json
import os
import time

from cron_celery.notifiers.base import Channel, Message


class FileChannel(Channel):
    def send(self, message: Message, timeout: float) -> None:
        line = json.dumps({"event": message.event, "execution": message.execution_id, "job": message.code,
                           "status": message.status, "at": time.time()}) + "\n"
        directory = os.environ["CRON_SOAK_MARKERS"]
        fd = os.open(os.path.join(directory, f"alerts-{os.getpid()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
