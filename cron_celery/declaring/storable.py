"""Whether a value can be stored in PostgreSQL as it is: text without a NUL character or a lone
surrogate, and JSON that ``jsonb`` takes and gives back unchanged.

Plain Python (no Django). PostgreSQL's text holds no NUL, and its UTF-8 holds no surrogate code
point (U+D800 to U+DFFF: halves of a UTF-16 pair, no character of their own). ``jsonb`` refuses
``\\u0000`` and a lone surrogate escape, and joins an escaped pair into the character it stands
for. Python lets each of them into a ``str``: ``json.loads`` of ``"\\u0000"`` or ``"\\ud800"``,
bytes that are not UTF-8 on a command line (read with ``surrogateescape``), a caller's own values.
A value checked here is refused before anything is written, naming what is wrong; one that is not
would be refused by the database in the middle of a write.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

#: How deep a JSON value may nest: far beyond any parameter (they are flat), far below Python's recursion limit.
MAX_DEPTH = 100


def text_problem(text: str) -> str:
    """Why PostgreSQL cannot store ``text`` as text or inside ``jsonb``, in words; '' when it can."""
    if "\x00" in text:
        return f"it holds a NUL character (\\x00) at position {text.index(chr(0))}, which PostgreSQL cannot store"
    for position, char in enumerate(text):
        if "\ud800" <= char <= "\udfff":
            return (f"it holds a lone surrogate ({ascii(char)[1:-1]}) at position {position}: not Unicode text "
                    "(bytes that are not UTF-8?), which PostgreSQL cannot store")
    return ""


def _needs_a_look(text: str) -> bool:
    return "\x00" in text or (not text.isascii() and any("\ud800" <= char <= "\udfff" for char in text))


def json_problem(value: Any, depth: int = 0) -> str:
    """Why ``jsonb`` cannot hold ``value`` (a JSON value as Python reads it) unchanged; '' when it can:
    a string or key that PostgreSQL cannot store, a number that is not finite or has more digits than
    Python writes, nesting deeper than ``MAX_DEPTH``, or a value JSON has no form for."""
    if depth > MAX_DEPTH:
        return f"it nests deeper than {MAX_DEPTH} levels"
    if value is None or isinstance(value, bool):
        return ""
    if isinstance(value, str):
        return text_problem(value) if _needs_a_look(value) else ""
    if isinstance(value, int):
        if value.bit_length() > 14_000:  # about 4,200 digits: Python's own limit for writing one is 4,300
            return "it is a whole number with too many digits"
        return ""
    if isinstance(value, float):
        return "" if math.isfinite(value) else f"it is {value!r}, not a finite number"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"it has a key that is not a string ({type(key).__name__})"
            found = json_problem(key, depth + 1) or json_problem(item, depth + 1)
            if found:
                return f"{key!a}: {found}" if key and not text_problem(key) else found
        return ""
    if isinstance(value, list | tuple):
        for item in value:
            found = json_problem(item, depth + 1)
            if found:
                return found
        return ""
    return f"JSON has no form for {type(value).__name__}"


def loads(text: str | bytes) -> Any:
    """``json.loads``, with nesting too deep for Python's recursion (``[[[[...``) refused as the
    ``ValueError`` every other text that is not JSON raises."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"it nests deeper than Python reads (recursion limit {sys.getrecursionlimit()})") from None


def shown(text: str) -> str:
    """``text`` with each NUL and lone surrogate written as its escape: safe in a message that is stored."""
    if not _needs_a_look(text):
        return text
    return "".join(ascii(char)[1:-1] if char == "\x00" or "\ud800" <= char <= "\udfff" else char for char in text)
