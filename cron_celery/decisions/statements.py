"""The statements every run sends (its claim and its final write), prepared once per database
session and then run with ``EXECUTE``: PostgreSQL parses and plans each once per session instead of
at every run (most of what a run costs the server; see docs/benchmarks.md).

A statement is prepared under a name made from a digest of its text (``PREPARE
cron_celery_claim_<digest>(types) AS ...``), so that one name always means one statement, whoever
prepared it. The first use on a connection sends ``PREPARE ...; EXECUTE ...`` as one query (one
round trip, one implicit transaction); later uses send ``EXECUTE`` alone.

Only outside a transaction (autocommit, no ``atomic`` block): a statement's error inside one would
abort the caller's transaction, so there the plain text is sent, as before. A session that lost what
was prepared on it (a pooler in transaction mode that hands each statement to another server
connection, ``DISCARD ALL``) answers the ``EXECUTE`` with an error that ran nothing; the statement is
then sent as plain text, and from then on this process prepares nothing. ``PREPARED_STATEMENTS =
False`` prepares nothing from the start, and neither does a connection with Django's
``"server_side_binding": True``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import DatabaseError, connection

from cron_celery import conf

logger = logging.getLogger(__name__)

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
#: SQLSTATEs of a session that does not hold a statement as this process believes:
#: invalid_sql_statement_name (not prepared there), feature_not_supported ("cached plan must not
#: change result type": a migration changed what it returns).
_LOST = frozenset({"26000", "0A000"})
#: duplicate_prepared_statement: prepared there already (by this process before it lost count, or by
#: another client of a pooled server connection: the same name is the same text, so it is ours).
_THERE = "42P05"


@dataclasses.dataclass(frozen=True)
class Statement:
    """One statement in its two forms: ``sql`` (Django's ``%(name)s`` placeholders), and its prepared
    form, ``prepare`` (``$n`` placeholders, typed) and ``execute`` (``EXECUTE name(%(name)s, ...)``)."""

    sql: str
    name: str
    prepare: str
    execute: str


def statement(label: str, sql: str, types: Mapping[str, str]) -> Statement:
    """``sql`` with ``%(name)s`` placeholders, each named in ``types`` with its PostgreSQL type (in the
    order of the prepared statement's parameters)."""
    order = list(types)
    used = set(_PLACEHOLDER.findall(sql))
    if used != set(order):
        raise ValueError(f"{label}: the placeholders {sorted(used)} are not the typed parameters {sorted(order)}")
    body = _PLACEHOLDER.sub(lambda found: f"${order.index(found.group(1)) + 1}", sql)
    text = f"({', '.join(types[key] for key in order)}) AS {body.strip()}"
    name = f"cron_celery_{label}_{hashlib.sha1(text.encode()).hexdigest()[:16]}"
    return Statement(sql=sql, name=name, prepare=f"PREPARE {name}{text}",
                     execute=f"EXECUTE {name}({', '.join(f'%({key})s' for key in order)})")


#: Names prepared on each open connection (the driver's connection object: a new one after a
#: reconnect starts empty).
_prepared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
#: Set once a session turned out not to keep what was prepared on it: nothing more is prepared.
_unkept = False


def _state(error: BaseException) -> str | None:
    return getattr(error.__cause__, "sqlstate", None) or getattr(error, "sqlstate", None)


def usable() -> bool:
    """Whether the next statement on Django's default connection may be prepared: not with
    ``"server_side_binding": True`` (psycopg then sends each query with the extended protocol, which
    takes one command a query and cannot type ``EXECUTE``'s parameters; psycopg prepares there by
    itself, at its ``prepare_threshold``)."""
    options = connection.settings_dict.get("OPTIONS") or {}
    return (not _unkept and conf.settings.PREPARED_STATEMENTS and options.get("server_side_binding") is not True
            and connection.connection is not None and connection.get_autocommit()
            and not connection.in_atomic_block)


def execute(cursor: Any, stmt: Statement, params: Mapping[str, Any]) -> None:
    """Run ``stmt`` on ``cursor`` (Django's, on the default connection); its result is then read as
    usual (``fetchone``, ``rowcount``)."""
    execute_together(cursor, (stmt,), params)


def together_possible() -> bool:
    """Whether statements may be sent together in one query (``execute_together``): not with
    ``"server_side_binding": True``, whose extended protocol takes one command a query."""
    options = connection.settings_dict.get("OPTIONS") or {}
    return options.get("server_side_binding") is not True


def execute_together(cursor: Any, stmts: Sequence[Statement], params: Mapping[str, Any]) -> None:
    """Run ``stmts`` one after another as one query: one round trip and one implicit transaction (one
    commit), each statement with a snapshot of its own, taken when the ones before it have run. The
    last one's result is then read as usual. ``params`` holds every statement's parameters by name."""
    global _unkept
    if not usable():
        _run(cursor, [stmt.sql for stmt in stmts], params)
        return
    names = _prepared.setdefault(connection.connection, set())
    try:
        _prepared_run(cursor, stmts, params, names)
        return
    except DatabaseError as error:
        state = _state(error)
        # The query was one transaction: a failed command rolled back what the others wrote. But a
        # PREPARE outlives it, so what the session holds now is asked, not assumed.
        _learn(names, stmts)
        if state != _THERE and state not in _LOST:
            raise
    if state == _THERE:
        try:
            _prepared_run(cursor, stmts, params, names)
            return
        except DatabaseError as error:
            if _state(error) not in _LOST:
                raise
    # This session does not keep prepared statements (or lost one of these).
    _unkept = True
    names.clear()
    logger.info("the database session did not keep a statement cron_celery prepared on it (a pooler in "
                "transaction mode?); this process sends its statements unprepared from now on")
    _run(cursor, [stmt.sql for stmt in stmts], params)


def _prepared_run(cursor: Any, stmts: Sequence[Statement], params: Mapping[str, Any], names: set[str]) -> None:
    """Those of ``stmts`` this session does not hold prepared, then every one executed, in one query."""
    new = [stmt for stmt in stmts if stmt.name not in names]
    _run(cursor, [stmt.prepare for stmt in new] + [stmt.execute for stmt in stmts], params)
    names.update(stmt.name for stmt in new)


def _learn(names: set[str], stmts: Sequence[Statement]) -> None:
    """Which of ``stmts`` the session holds now (after a failed query: its PREPAREs that ran stay, one
    that failed was held already or not at all); nothing learnt from a session that cannot answer."""
    wanted = [stmt.name for stmt in stmts]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM pg_prepared_statements WHERE name = ANY(%s)", [wanted])
            held = {str(row[0]) for row in cursor.fetchall()}
    except DatabaseError:
        return
    names.difference_update(wanted)
    names.update(held)


def _run(cursor: Any, commands: list[str], params: Mapping[str, Any]) -> None:
    """The commands as one query, the cursor left on the last one's result."""
    cursor.execute(";\n".join(commands), params)
    for _ in commands[1:]:
        cursor.nextset()


def reset() -> None:
    """Forget what was learnt (tests)."""
    global _unkept
    _unkept = False
    _prepared.clear()
