"""What every channel shares: the ``Message`` it sends and the ``Channel`` interface.

A custom channel is a class with this interface, named by dotted path in
``NOTIFICATIONS`` (see docs/notifications.md)::

    class PagerChannel(Channel):
        required = ("routing_key",)
        secrets = ("routing_key",)

        def send(self, message: Message, timeout: float) -> None:
            ...  # raise on failure; the delivery is retried with backoff
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, ClassVar

from cron_celery import exceptions

#: How an event reads in a title.
EVENT_WORDS = {
    "FAILED": "failed", "TIMED_OUT": "timed out", "LOST": "was lost", "MISSED": "missed a slot",
    "RECOVERED": "recovered", "SUCCEEDED": "succeeded", "UPSTREAM": "was skipped: an upstream job failed",
    "LATE": "has not started in time", "LONG_RUNNING": "is running too long", "TOO_FAST": "finished too fast",
    "TOO_FAST_RECOVERED": "takes long enough again", "PAUSED": "paused itself after failing again and again",
}
#: Events that warn of a run's timing rather than report a failure.
WARNING_EVENTS = frozenset({"LATE", "LONG_RUNNING", "TOO_FAST"})
#: At most this many lines and characters of an error go into a message.
ERROR_LINES, ERROR_CHARS = 12, 1500


@dataclasses.dataclass(frozen=True, kw_only=True)
class Message:
    """One alert, with what a person needs to act on it."""

    event: str
    job: str
    code: str
    slot: dt.datetime
    execution_date: dt.date
    execution_id: int
    run_number: int
    attempt: int
    status: str
    trigger: str
    duration: float | None  # seconds
    error_code: str
    error: str  # the execution's message
    traceback: str
    admin_url: str  # empty without ADMIN_BASE_URL
    params: str = ""  # the parameter values the run was given ("region=us, dry_run=true"); empty: none
    delivery_id: str = ""  # the same for every attempt of one alert row (``delivery_id``); empty: none

    @property
    def title(self) -> str:
        return f"[cron] {self.job} ({self.code}) {EVENT_WORDS.get(self.event, self.event.lower())}"

    @property
    def failing(self) -> bool:
        return self.event in ("FAILED", "TIMED_OUT", "LOST", "MISSED", "UPSTREAM", "PAUSED")

    @property
    def warning(self) -> bool:
        """A timing alert (LATE, LONG_RUNNING, TOO_FAST): something to look at, not a failure."""
        return self.event in WARNING_EVENTS

    def facts(self) -> list[tuple[str, str]]:
        """(label, value) pairs, in the order a person reads them."""
        pairs = [
            ("Job", f"{self.job} ({self.code})"),
            ("Slot", self.slot.strftime("%Y-%m-%d %H:%M:%S UTC")),
            ("Execution date", self.execution_date.isoformat()),
            ("Status", self.status),
            ("Attempt", str(self.attempt)),
            ("Run", f"#{self.run_number} ({self.trigger.lower()})"),
        ]
        if self.params:
            pairs.append(("Parameters", self.params))
        if self.duration is not None:
            pairs.append(("Duration", f"{self.duration:.1f} s"))
        if self.error_code:
            pairs.append(("Error code", self.error_code))
        return pairs

    def excerpt(self) -> str:
        """The first lines of the error, bounded."""
        lines = self.error.strip().splitlines()[:ERROR_LINES]
        text = "\n".join(lines)
        return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + " …"

    def text(self) -> str:
        """Plain text (email, logs)."""
        body = [self.title, ""] + [f"{label}: {value}" for label, value in self.facts()]
        if self.error.strip():
            body += ["", self.excerpt()]
        if self.admin_url:
            body += ["", self.admin_url]
        return "\n".join(body)

    def as_dict(self) -> dict[str, Any]:
        found = {
            "event": self.event, "job": self.job, "code": self.code, "slot": self.slot.isoformat(),
            "execution_date": self.execution_date.isoformat(), "execution_id": self.execution_id,
            "run_number": self.run_number, "attempt": self.attempt, "status": self.status, "trigger": self.trigger,
            "duration_seconds": self.duration, "error_code": self.error_code, "error": self.excerpt(),
            "admin_url": self.admin_url or None,
        }
        if self.delivery_id:  # in the signed body: a receiver drops a repeat by it
            found["delivery_id"] = self.delivery_id
        return {**found, "params": self.params} if self.params else found  # a run with parameters names them


def delivery_id(*parts: object) -> str:
    """A delivery's id from what identifies its alert (the row's id and creation time, its event and
    channel...): the hex SHA-256 of them, so it stays the same for every attempt of the alert however
    the execution it describes changes, and two databases' alert rows of the same id differ."""
    return hashlib.sha256(":".join(str(part) for part in parts).encode()).hexdigest()


class Channel:
    """A way to send alerts. Options come from ``NOTIFICATIONS[name]``.

    ``required`` names the options that must be set (a system check reports them), and
    ``secrets`` those never shown in logs, errors or the admin.
    """

    required: ClassVar[tuple[str, ...]] = ()
    secrets: ClassVar[tuple[str, ...]] = ()

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        self.name = name
        self.options = options

    def problems(self) -> list[str]:
        """What is missing from the options, in words."""
        return [f"option {key!r} is missing" for key in self.required if not self.options.get(key)]

    def send(self, message: Message, timeout: float) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def redact(self, text: str) -> str:
        """``text`` with every secret option's value replaced by ``***`` — and, for a URL,
        each longer part of its path and its query too, which servers echo in errors."""
        parts: list[str] = []
        for key in self.secrets:
            value = str(self.options.get(key) or "")
            if not value:
                continue
            parts.append(value)
            if "://" in value:
                url = urllib.parse.urlsplit(value)
                parts += [segment for segment in url.path.split("/") if len(segment) >= 6]
                parts += [url.query] if len(url.query) >= 6 else []
        for part in sorted(parts, key=len, reverse=True):
            text = text.replace(part, "***")
        return text


def post_json(url: str, payload: object, timeout: float, headers: dict[str, str] | None = None) -> bytes:
    """POST ``payload`` as JSON; raises ``DeliveryFailed`` unless the answer is 2xx."""
    body = json.dumps(payload, ensure_ascii=False).encode()
    return post(url, body, timeout, {"Content-Type": "application/json; charset=utf-8", **(headers or {})})


def post(url: str, body: bytes, timeout: float, headers: dict[str, str]) -> bytes:
    request = urllib.request.Request(url, data=body, method="POST", headers={"User-Agent": "cron_celery", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read()[:300].decode(errors="replace")
        raise exceptions.DeliveryFailed(f"HTTP {error.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise exceptions.DeliveryFailed(f"{type(reason).__name__}: {reason}") from None
