"""Bearer tokens for the endpoints: named, scoped, several valid at once.

``CRON_CELERY["API_TOKENS"]`` maps a name to a token and its scopes::

    CRON_CELERY = {"API_TOKENS": {
        "prometheus": {"token": os.environ["CRON_TOKEN_PROMETHEUS"], "scopes": ["metrics"]},
        "deploy": {"token": os.environ["CRON_TOKEN_DEPLOY"], "scopes": ["run"]},
    }}

A scope may imply others (``IMPLIES``): ``read`` gives ``metrics`` too, so a token that read
everything before ``metrics`` existed still scrapes; ``metrics`` gives nothing else.

A presented token is hashed once and compared with every configured token's hash by
``hmac.compare_digest`` — all of them, whatever matched, so the time taken says neither
which token matched nor how long the tokens are. Token values are never logged, shown in
an answer or in a check message; ``Token`` keeps only the hash and leaves it out of its repr.

The deprecated ``CRON_CELERY["API_TOKEN"]`` still works, as a token named ``API_TOKEN``
with every scope it had (read, run and force; read gives metrics), with a ``DeprecationWarning``
and the system check warning ``cron_celery.W002``. A token the checks refuse is never accepted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
import threading
import warnings
from collections.abc import Iterable
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from cron_celery import conf

#: ``status/`` (every job's messages and parameter values), ``health/``, and ``metrics/`` (``IMPLIES``).
READ = "read"
#: ``metrics/`` alone: a Prometheus scrape, which shows neither messages nor parameter values.
METRICS = "metrics"
#: ``POST run/<job>/`` (also with ``rerun``).
RUN = "run"
#: ``POST run/<job>/`` with ``force`` (runs a paused job, and a slot that already ran); needs ``run`` too.
FORCE = "force"
#: ``audit/``: the log of schedule changes (who changed what), for auditors; ``read`` does not give it.
AUDIT = "audit"
#: ``POST pause/<job>/`` and ``POST resume/<job>/``: a pipeline that pauses jobs for a maintenance window.
PAUSE = "pause"
SCOPES = (READ, METRICS, RUN, FORCE, AUDIT, PAUSE)
#: The scopes a scope gives besides itself.
IMPLIES: dict[str, frozenset[str]] = {READ: frozenset({METRICS})}
#: What the deprecated ``API_TOKEN`` grants: every scope there was when it was replaced (with
#: ``read``, ``metrics`` too).
LEGACY_SCOPES = (READ, RUN, FORCE)

#: Shortest token accepted in ``API_TOKENS``: ``secrets.token_urlsafe(32)`` gives 43 characters.
MIN_LENGTH = 32
#: Shortest ``API_TOKEN`` (the deprecated setting kept its old rule).
LEGACY_MIN_LENGTH = 16
LEGACY_NAME = "API_TOKEN"
#: RFC 6750's b64token: what fits in ``Authorization: Bearer <token>`` unchanged.
TOKEN_SYNTAX = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
NAME_SYNTAX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
ENTRY_KEYS = frozenset({"token", "scopes"})

DEPRECATION = (
    "CRON_CELERY['API_TOKEN'] is deprecated: it grants the scopes read, run and force. Write "
    "CRON_CELERY['API_TOKENS'] = {'legacy': {'token': os.environ['CRON_API_TOKEN'], "
    "'scopes': ['read', 'run', 'force']}} instead, then give each caller a token of its own with only "
    "the scopes it needs (see docs/operations.md)."
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Token:
    """A configured token: its name, its scopes and the SHA-256 of its value (never the value)."""

    name: str
    scopes: frozenset[str]
    digest: bytes = dataclasses.field(repr=False)
    legacy: bool = False

    def allows(self, scope: str) -> bool:
        return any(scope == given or scope in IMPLIES.get(given, ()) for given in self.scopes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Parsed:
    """The settings read: the tokens accepted, and what the checks report (values never named)."""

    tokens: tuple[Token, ...]
    problems: tuple[str, ...]
    legacy: bool  # API_TOKEN is set (and a string)


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def _scopes(where: str, value: object) -> tuple[frozenset[str] | None, list[str]]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        return None, [f"{where}['scopes'] must be a list of scopes ({', '.join(SCOPES)})."]
    scopes = list(value)
    unknown = [scope for scope in scopes if scope not in SCOPES]
    if unknown:
        return None, [f"{where}['scopes'] has unknown scopes {unknown!r}; use {', '.join(SCOPES)}."]
    if not scopes:
        return None, [f"{where}['scopes'] is empty: give the token at least one of {', '.join(SCOPES)}."]
    if FORCE in scopes and RUN not in scopes:
        return None, [f"{where}['scopes'] has 'force' without 'run': force only widens a run."]
    return frozenset(scopes), []


def _entry(name: object, entry: object) -> tuple[Token | None, str | None, list[str]]:
    """One ``API_TOKENS`` entry: (the token or None, its value for the duplicate check, problems)."""
    if not isinstance(name, str) or not NAME_SYNTAX.fullmatch(name):
        return None, None, [f"CRON_CELERY['API_TOKENS'] has a name {name!r} that is not 1-64 letters, digits, "
                            "'_', '.' or '-'."]
    where = f"CRON_CELERY['API_TOKENS'][{name!r}]"
    if not isinstance(entry, dict):
        return None, None, [f"{where} must be a dict with 'token' and 'scopes'."]
    problems: list[str] = []
    unknown = sorted(str(key) for key in entry if key not in ENTRY_KEYS)
    if unknown:
        problems.append(f"{where} has unknown keys {unknown}; use 'token' and 'scopes'.")
    value = entry.get("token")
    if not isinstance(value, str) or not value:
        problems.append(f"{where}['token'] must be a non-empty string"
                        + ("" if value is None or isinstance(value, str) else f", not {type(value).__name__}") + ".")
        value = None
    elif len(value) < MIN_LENGTH:
        problems.append(f"{where}['token'] is shorter than {MIN_LENGTH} characters: use a long random string, "
                        "such as python -c 'import secrets; print(secrets.token_urlsafe(32))' prints.")
    elif not TOKEN_SYNTAX.fullmatch(value):
        problems.append(f"{where}['token'] has characters a Bearer header cannot carry (spaces, quotes...): use "
                        "letters, digits and - . _ ~ + / (secrets.token_urlsafe).")
    scopes, wrong = _scopes(where, entry.get("scopes"))
    problems += wrong
    if problems or scopes is None or value is None:
        return None, value, problems
    return Token(name=name, scopes=scopes, digest=_digest(value)), value, []


def parse(settings: conf.Settings) -> Parsed:
    """Read ``API_TOKENS`` and the deprecated ``API_TOKEN`` from these settings."""
    tokens: list[Token] = []
    problems: list[str] = []
    values: dict[str, list[str]] = {}  # token value -> the names that use it
    configured: Any = settings.API_TOKENS
    if configured is None:
        configured = {}
    if not isinstance(configured, dict):
        problems.append("CRON_CELERY['API_TOKENS'] must be a dict of name: {'token': ..., 'scopes': [...]}.")
        configured = {}
    refused: set[str] = set()
    for name, entry in configured.items():
        token, value, wrong = _entry(name, entry)
        problems += wrong
        if value is not None:
            values.setdefault(value, []).append(str(name))
        if token is not None:
            tokens.append(token)
    legacy = settings.API_TOKEN
    is_legacy = isinstance(legacy, str) and bool(legacy)
    if is_legacy and len(legacy) >= LEGACY_MIN_LENGTH:  # shorter or not a string: cron_celery.E013
        values.setdefault(legacy, []).append(LEGACY_NAME)
        tokens.append(Token(name=LEGACY_NAME, scopes=frozenset(LEGACY_SCOPES), digest=_digest(legacy), legacy=True))
    for names in values.values():
        if len(names) > 1:
            shown = ", ".join(repr(name) for name in names)
            problems.append(f"The API tokens {shown} have the same value: give each caller a token of its own, "
                            "so that one can be revoked without the other.")
            refused.update(names)
    accepted = tuple(token for token in tokens if token.name not in refused)
    return Parsed(tokens=accepted, problems=tuple(problems), legacy=is_legacy)


_parsed: Parsed | None = None
_lock = threading.Lock()


def current() -> Parsed:
    """The tokens of the current settings, read once (again after a settings change)."""
    global _parsed
    parsed = _parsed
    if parsed is None:
        with _lock:
            parsed = _parsed
            if parsed is None:
                parsed = _parsed = parse(conf.get())
                if parsed.legacy:
                    warnings.warn(DEPRECATION, DeprecationWarning, stacklevel=2)
    return parsed


def match(presented: str) -> Token | None:
    """The configured token equal to ``presented``, compared in constant time with each one."""
    digest = _digest(presented)
    found: Token | None = None
    for token in current().tokens:
        same = hmac.compare_digest(digest, token.digest)  # always every token: no early exit
        found = token if same and found is None else found
    return found


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global _parsed
    if setting == "CRON_CELERY":
        _parsed = None
