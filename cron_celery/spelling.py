"""Did you mean: the known name closest to a misspelt one (a job option, a setting key, an upstream job's
name, a parameter), for the error that refuses it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, known: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The known name most like ``word``, if one is like it enough; case is ignored."""
    by_folded = {name.casefold(): name for name in known}
    found = difflib.get_close_matches(word.casefold(), sorted(by_folded), n=1, cutoff=cutoff)
    return by_folded[found[0]] if found else None


def suggestion(word: str, known: Iterable[str]) -> str:
    """ "did you mean 'x'? " (with its trailing space), or nothing."""
    found = closest(word, known)
    return f"did you mean {found!r}? " if found else ""
