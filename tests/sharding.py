"""A pytest plugin (``-p tests.sharding``) that splits one line's test files between processes
run side by side by scripts/test.

Most of the suite waits on real processes (workers, beats, servers of its own), not on the CPU,
so two sessions per Django line finish sooner than one. Each process is a whole session of its
own, exactly like a line: its own databases (scripts/test gives each a name), its own Celery
queue, its own servers.

``CRON_TEST_LINE=K/N`` (scripts/test sets it on a full run of N Django lines) deals the files of
``ONCE_PER_RUN`` between the lines the same way, so that each runs on one line of every run: the
fault scenarios and the models drive real processes and the claim protocol's SQL, which are the
same on every line, and they are most of the suite's seconds. Every other file runs on every line.
``CRON_TEST_EVERY_LINE=1`` runs every file on every line.

``CRON_TEST_SHARD=K/N`` keeps the files that fall to process K of N (1-based). Whole files go
together, so module fixtures are never started twice. Files are dealt heaviest first to the
least loaded process, by the seconds recorded in ``tests/durations.json`` (a file not listed
there counts 0.4 s per test; ``CRON_TEST_DURATIONS_TABLE=PATH`` names another table: scripts/test
passes a copy taken before its sessions start). ``CRON_TEST_DURATIONS_OUT=PATH`` adds this session's seconds
per file to PATH (JSON; every session of a run may name the same file), to refresh that table.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

TABLE = Path(__file__).with_name("durations.json")
UNKNOWN_TEST_SECONDS = 0.4
UNKNOWN_FILE_SECONDS = 10.0
#: Folders whose files run on one Django line of a full run (CRON_TEST_LINE), not on each.
ONCE_PER_RUN = ("tests/faults/", "tests/model/")

_spent: defaultdict[str, float] = defaultdict(float)


def shard_of(spec: str, variable: str = "CRON_TEST_SHARD") -> tuple[int, int]:
    """``"K/N"`` -> (K, N), or a UsageError that says what is wrong."""
    try:
        index, count = (int(part) for part in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"{variable}={spec!r}: expected K/N, e.g. 1/2") from None
    if not 1 <= index <= count:
        raise pytest.UsageError(f"{variable}={spec!r}: K must be between 1 and N")
    return index, count


def deal(weights: dict[str, float], count: int) -> list[set[str]]:
    """Files into ``count`` groups of near-equal weight: heaviest first, each to the lightest group
    (ties go to the lower group, and files of equal weight in name order, so every process deals
    the same way)."""
    groups: list[set[str]] = [set() for _ in range(count)]
    loads = [0.0] * count
    for name in sorted(weights, key=lambda file: (-weights[file], file)):
        lightest = min(range(count), key=lambda group: (loads[group], group))
        groups[lightest].add(name)
        loads[lightest] += weights[name]
    return groups


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def this_line(weights: dict[str, float], spec: str, recorded: dict[str, float] | None = None) -> set[str]:
    """The files of this line (``CRON_TEST_LINE=K/N``): every file outside ONCE_PER_RUN, and the
    ONCE_PER_RUN files dealt to line K by their ``recorded`` seconds (by default ``weights``). A file
    with none recorded weighs UNKNOWN_FILE_SECONDS, not its tests: a line may collect another number."""
    index, count = shard_of(spec, "CRON_TEST_LINE")
    table = weights if recorded is None else recorded
    once = {name: float(table.get(name, UNKNOWN_FILE_SECONDS)) for name in weights if name.startswith(ONCE_PER_RUN)}
    return (set(weights) - set(once)) | deal(once, count)[index - 1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = os.environ.get("CRON_TEST_SHARD")
    line = "" if os.environ.get("CRON_TEST_EVERY_LINE") == "1" else os.environ.get("CRON_TEST_LINE", "")
    if not spec and not line:
        return
    # Every session reads one table: scripts/test names a copy taken before any session starts.
    table = Path(os.environ.get("CRON_TEST_DURATIONS_TABLE") or TABLE)
    recorded = json.loads(table.read_text()) if table.exists() else {}
    tests_per_file: defaultdict[str, int] = defaultdict(int)
    for item in items:
        tests_per_file[_file(item.nodeid)] += 1
    weights = {name: float(recorded.get(name, UNKNOWN_TEST_SECONDS * tests)) for name, tests in tests_per_file.items()}
    if line:
        weights = {name: weights[name] for name in this_line(weights, line, recorded)}
    mine = set(weights)
    if spec:
        index, count = shard_of(spec)
        mine = deal(weights, count)[index - 1]
    kept = [item for item in items if _file(item.nodeid) in mine]
    dropped = [item for item in items if _file(item.nodeid) not in mine]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get("CRON_TEST_DURATIONS_OUT"):
        _spent[_file(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("CRON_TEST_DURATIONS_OUT")
    if not out or not _spent:
        return
    # Sessions side by side add their files to one table (the slower line's figure is kept).
    with open(out, "a+") as table:
        fcntl.flock(table, fcntl.LOCK_EX)
        table.seek(0)
        merged = json.loads(table.read() or "{}")
        for name, seconds in _spent.items():
            merged[name] = max(round(seconds, 1), merged.get(name, 0.0))
        table.seek(0)
        table.truncate()
        table.write(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
