"""The package's module graph: no cycles, and declarations that need no ORM.

Every ``import`` and ``from ... import`` under ``cron_celery/`` counts, wherever it is written:
at the top of a module, inside a function, or under ``TYPE_CHECKING``; so do the modules the
package's ``__init__`` loads lazily (``_LAZY``, its public names). An import of a name that is
a module (``from cron_celery import runs``) points at that module; of any other name, at the
module that defines it.
"""

from __future__ import annotations

import ast
import importlib
import itertools
from pathlib import Path

import pytest

PACKAGE = Path(importlib.import_module("cron_celery").__file__ or "").parent

#: Edges a cycle may use, each with its reason. Empty: the graph needs none (Django loads
#: the package's ``__init__`` first, and it imports its public names lazily, downwards).
ALLOWED: dict[tuple[str, str], str] = {}

#: Modules a job declaration or a Redis lock depends on: none of them may reach the ORM.
DECLARATIONS = ("cron_celery.enums", "cron_celery.registry", "cron_celery.locks", "cron_celery.schedules")


def module_names() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        if "migrations" in relative.parts:
            continue
        name = ".".join(relative.parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The package's modules this one imports, with the line of the first import of each; and
    ``django.db`` (as a pseudo-module) where it is imported."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: dict[str, int] = {}

    def add(module: str, line: int) -> None:
        if module == "django.db" or module.startswith("django.db."):
            targets.setdefault("django.db", line)
            return
        while module and module not in known:
            module = module.rpartition(".")[0]
        if module and module != name:
            targets.setdefault(module, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package
                for _ in range(node.level - 1):
                    parent = parent.rpartition(".")[0]
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base, node.lineno)
        elif (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)
              and isinstance(node.value, ast.Dict)):
            for value in node.value.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    add(value.value, node.lineno)
    return targets


def graph() -> dict[str, dict[str, int]]:
    known = module_names()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), as a module path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, {}):
            if (node, nxt) in ALLOWED or nxt not in edges:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    found = []
    for group in groups:  # walk the group from its first member back to itself
        members, start = set(group), min(group)
        path, seen, node = [start], {start}, start
        while True:
            nxt = next(n for n in sorted(edges[node]) if n in members and (node, n) not in ALLOWED
                       and (n == start or n not in seen))
            path.append(nxt)
            if nxt == start:
                break
            seen.add(nxt)
            node = nxt
        found.append(path)
    return found


def describe(path: list[str], edges: dict[str, dict[str, int]]) -> str:
    steps = [f"{a} (line {edges[a][b]}) -> {b}" for a, b in itertools.pairwise(path)]
    return " ; ".join(steps)


def longest_path(edges: dict[str, dict[str, int]]) -> list[str]:
    """The longest chain of imports (the graph must be acyclic)."""
    memo: dict[str, list[str]] = {}

    def from_(node: str) -> list[str]:
        if node not in memo:
            best = max((from_(n) for n in edges[node] if n in edges), key=len, default=[])
            memo[node] = [node, *best]
        return memo[node]

    return max((from_(node) for node in sorted(edges)), key=len)


def test_the_module_graph_has_no_cycle():
    edges = graph()
    assert len(edges) > 40  # the walk found the package
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(describe(path, edges) for path in found)


def test_every_allowed_edge_exists():
    edges = graph()
    for (source, target), reason in ALLOWED.items():
        assert reason and target in edges.get(source, {}), (source, target)


def test_the_cycle_check_finds_a_cycle_through_a_function_local_import(tmp_path):
    """The check itself: a cycle made only by an import inside a function is named, with its lines."""
    package = tmp_path / "knot"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def later():\n    from knot import high\n    return high\n")
    (package / "high.py").write_text("from knot import low\n")
    known = {"knot": package / "__init__.py", "knot.low": package / "low.py", "knot.high": package / "high.py"}
    edges = {name: imports_of(name, path, known) for name, path in known.items()}
    (found,) = cycles(edges)
    assert describe(found, edges) == "knot.high (line 1) -> knot.low ; knot.low (line 2) -> knot.high"


@pytest.mark.parametrize("module", DECLARATIONS)
def test_declarations_and_locks_need_no_orm(module):
    """A job declaration and a Redis lock reach neither ``cron_celery.models`` nor ``django.db``."""
    seen = reachable(graph(), module)
    assert "cron_celery.models" not in seen
    assert "django.db" not in seen


def reachable(edges: dict[str, dict[str, int]], module: str) -> set[str]:
    seen, todo = {module}, [module]
    while todo:
        for nxt in edges.get(todo.pop(), {}):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("module", ["cron_celery.runs", "cron_celery.outcomes", "cron_celery.events"])
def test_the_run_path_knows_no_listener(module):
    """Sentry, the alert outbox and the signals are listeners: the run path reaches none of them."""
    found = reachable(graph(), module)
    assert not found & {"cron_celery.sentry", "cron_celery.alerts", "cron_celery.signals",
                        "cron_celery.notifiers.sentry"}
