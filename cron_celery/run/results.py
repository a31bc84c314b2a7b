"""What a job's body came to, as PostgreSQL stores it: a returned value read as a status, message and
result (``interpret``), an exception as a status, message, error code and traceback
(``describe_exception``), text and JSON cleaned of what the database refuses."""

from __future__ import annotations

import json
import math
import re
import traceback as tb
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from cron_celery import conf, enums, exceptions

S = enums.Status

#: Code points PostgreSQL cannot store in text: lone surrogates (how Python hands over bytes
#: that are not UTF-8, e.g. ``os.fsdecode`` of a file name) cannot even be encoded to send.
_SURROGATES = re.compile("[\ud800-\udfff]")
#: A surrogate escaped by ``json.dumps`` (jsonb refuses it too).
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _text(text: str) -> str:
    """``text`` without what PostgreSQL cannot store: NUL and lone surrogates become U+FFFD."""
    return _SURROGATES.sub("\ufffd", text.replace("\x00", "\ufffd"))


def clean_text(text: str, limit: int) -> str:
    """Storable text (see ``_text``); long text is cut with a visible marker."""
    text = _text(text)
    if len(text) > limit:
        cut = len(text) - limit
        text = f"{text[:limit]}\n… [truncated {cut} characters]"
    return text


def _storable(value: Any) -> Any:
    """``value`` with what JSON allows and jsonb refuses replaced: NaN and the infinities become
    the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; lone surrogates in strings (and keys)
    become U+FFFD. Anything else is left for ``json.dumps`` to accept or refuse."""
    if isinstance(value, str):
        return _SURROGATES.sub("\ufffd", value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {_storable(key) if isinstance(key, str | float) else key: _storable(item)
                for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(item) for item in value]
    return value


def _jsonable(value: Any) -> tuple[Any, str]:
    """(value to store in ``result``, error message if it cannot be stored as JSON)."""
    try:
        try:
            encoded = json.dumps(value, allow_nan=False)
        except ValueError:  # NaN or an infinity: JSON's own encoder allows them, jsonb does not
            value = _storable(value)
            encoded = json.dumps(value, allow_nan=False)
        else:
            if _ESCAPED_SURROGATE.search(encoded):
                value = _storable(value)
                encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        preview = clean_text(repr(value), 200)
        return None, (
            f"The job returned a value that is not JSON-serialisable "
            f"({type(value).__name__}: {preview}); return str, int, float, bool, None, "
            f"or lists and dicts of them. ({exc})"
        )
    limit = conf.settings.RESULT_MAX_CHARS
    if len(encoded) > limit or "\\u0000" in encoded:
        return {"truncated": True, "preview": clean_text(encoded, limit)[:limit]}, ""
    return value, ""


def interpret(value: Any) -> tuple[str, str, str, Any]:
    """(status, message, error_code, stored result) from a job's return value."""
    stored, problem = _jsonable(value)
    limit = conf.settings.MESSAGE_MAX_CHARS
    if problem:
        return S.FAILED, clean_text(problem, limit), "NOT_JSON", None
    if isinstance(value, dict) and "error" in value:
        message = clean_text(str(value.get("message", "")), limit)
        code = clean_text(str(value.get("error_code", "") or ""), 50)[:50]
        if value.get("error"):
            return S.FAILED, message, code or "JOB_ERROR", stored
        return S.SUCCEEDED, message, code, stored
    message = value if isinstance(value, str) else ""
    return S.SUCCEEDED, clean_text(message, limit), "", stored


def interpret_plain(value: Any) -> tuple[str, str, str, Any]:
    """(status, message, error_code, stored result) from what a tracked periodic task's own task
    returned: whatever it is, a success (its Celery result is its own business); the value kept as
    JSON when it is JSON, else as its ``repr``; a string is the message too."""
    stored, problem = _jsonable(value)
    if problem:
        stored = {"repr": clean_text(repr(value), 1000)}
    message = value if isinstance(value, str) else ""
    return S.SUCCEEDED, clean_text(message, conf.settings.MESSAGE_MAX_CHARS), "", stored


def describe_exception(exc: BaseException) -> tuple[str, str, str, str]:
    """(status, message, error_code, traceback) for an exception raised by a job."""
    settings = conf.settings
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not hide the failure
        text = "<unprintable exception>"
    if isinstance(exc, exceptions.JobFailed):
        label = text
    else:
        label = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    message = clean_text(label, settings.MESSAGE_MAX_CHARS)
    # Format the traceback from the frames, then the (possibly huge) message once, cut.
    frames = "".join(tb.format_tb(exc.__traceback__))
    trace = clean_text(f"Traceback (most recent call last):\n{frames}{message}",
                   settings.TRACEBACK_MAX_CHARS)
    if isinstance(exc, SoftTimeLimitExceeded):
        return S.TIMED_OUT, message, "TIME_LIMIT", trace
    code = getattr(exc, "error_code", "") or type(exc).__name__
    return S.FAILED, message, clean_text(str(code), 50)[:50], trace
