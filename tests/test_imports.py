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

pytestmark = pytest.mark.pure  # needs neither PostgreSQL nor Redis

PACKAGE = Path(importlib.import_module("cron_celery").__file__ or "").parent

#: Edges a cycle may use, each with its reason. Empty: the graph needs none (Django loads
#: the package's ``__init__`` first, and it imports its public names lazily, downwards).
ALLOWED: dict[tuple[str, str], str] = {}

#: The rooms of the package, from the bottom up: a module imports only modules of its own room and of the
#: rooms beneath it (docs/architecture.md draws them). ``top`` is the base at the package's top level;
#: ``entry`` is what nothing of ours imports: the package's public face, Django's and Celery's entry points.
ROOMS = ("top", "declaring", "decisions", "run", "tracking", "notifiers", "alerts", "beat", "reconciler", "web",
         "admin", "entry")
#: The top level's base, beneath every room: settings, the enums, the exceptions, the models, the schedules.
BASE = frozenset({"cron_celery.conf", "cron_celery.enums", "cron_celery.exceptions", "cron_celery.models",
                  "cron_celery.schedules", "cron_celery.check_errors", "cron_celery.spelling",
                  "cron_celery.slots", "cron_celery.catch_up", "cron_celery.counts"})
#: The top level's public paths of modules that live in a room (each re-exports its room's module).
PUBLIC_PATHS = {"cron_celery.events": "cron_celery.run.events", "cron_celery.signals": "cron_celery.alerts.signals",
                "cron_celery.audit": "cron_celery.decisions.audit"}

#: Modules a job declaration or a Redis lock depends on: none of them may reach the ORM.
DECLARATIONS = ("cron_celery.enums", "cron_celery.declaring.registry", "cron_celery.run.locks", "cron_celery.schedules",
                "cron_celery.slots", "cron_celery.catch_up")


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


def room_of(module: str) -> str:
    if module in BASE:
        return "top"
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ROOMS and parts[1] not in ("top", "entry") and module not in PUBLIC_PATHS:
        return parts[1]
    return "entry"


def room_breaks(edges: dict[str, dict[str, int]]) -> list[str]:
    """Each import that points up the rooms, as "module (room, line N) -> module (room)"."""
    return [f"{source} ({room_of(source)}, line {line}) -> {target} ({room_of(target)})"
            for source, targets in sorted(edges.items()) for target, line in sorted(targets.items())
            if target != "django.db" and ROOMS.index(room_of(target)) > ROOMS.index(room_of(source))]


def test_every_module_is_in_a_room_and_every_import_points_down_the_rooms():
    edges = graph()
    top = sorted(name for name in edges if name.count(".") == 1 and not (PACKAGE / name.split(".")[1]).is_dir())
    assert set(top) == BASE | set(PUBLIC_PATHS) | {"cron_celery.apps", "cron_celery.checks", "cron_celery.urls"}, top
    assert not room_breaks(edges), "imports up the rooms:\n" + "\n".join(room_breaks(edges))


def test_a_public_path_re_exports_its_rooms_module_and_nothing_of_ours_imports_it():
    edges = graph()
    for public, real in PUBLIC_PATHS.items():
        assert list(edges[public]) == [real], (public, edges[public])
        assert vars(importlib.import_module(real)).keys() - vars(importlib.import_module(public)).keys() <= {
            name for name in vars(importlib.import_module(real)) if name.startswith("_")} | {"annotations"}
    importers = {source: target for source, targets in edges.items() for target in targets if target in PUBLIC_PATHS}
    assert not importers, importers


def test_the_room_check_names_an_import_up_the_rooms():
    """The check itself: a decision that imports the web, and the run path that imports the beat."""
    edges = {"cron_celery.decisions.claims": {"cron_celery.web.views": 3, "cron_celery.enums": 1},
             "cron_celery.run.tasks": {"cron_celery.beat.schedule_sync": 7, "cron_celery.decisions.claims": 2},
             "cron_celery.apps": {"cron_celery.admin": 1}}
    assert room_breaks(edges) == [
        "cron_celery.decisions.claims (decisions, line 3) -> cron_celery.web.views (web)",
        "cron_celery.run.tasks (run, line 7) -> cron_celery.beat.schedule_sync (beat)"]


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


@pytest.mark.parametrize("module", ["cron_celery.run.runs", "cron_celery.run.outcomes", "cron_celery.run.events"])
def test_the_run_path_knows_no_listener(module):
    """Sentry, the alert outbox and the signals are listeners: the run path reaches none of them."""
    found = reachable(graph(), module)
    assert not found & {"cron_celery.alerts.sentry", "cron_celery.alerts", "cron_celery.alerts.signals",
                        "cron_celery.notifiers.sentry"}


#: No module of the package or the benchmarks over this many lines, no function over ``FUNCTION_LINES``.
MODULE_LINES, FUNCTION_LINES = 450, 80
#: Exceptions to the limits, each at its size then: none may grow and none may be added (the benchmarks and
#: the dashboard's picture were the last to leave it).
OVERSIZED: dict[str, int] = {}


def sizes(root: Path) -> dict[str, int]:
    """Lines of every module of the package (its migrations aside), the benchmarks and the picture
    script, and of every function in them over ``FUNCTION_LINES`` ("path:function")."""
    paths = [path for path in sorted((root / "cron_celery").rglob("*.py")) if "migrations" not in path.parts]
    paths += [*sorted((root / "bench").rglob("*.py")), root / "scripts" / "dashboard_picture"]
    found = {}
    for path in paths:
        text = path.read_text(encoding="utf-8")
        name = str(path.relative_to(root))
        found[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1 - _docstring_lines(node)
                if length > FUNCTION_LINES:
                    found[f"{name}:{node.name}"] = max(length, found.get(f"{name}:{node.name}", 0))
    return found


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's docstring is its reference text, not code to read at once: it does not count."""
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def too_long(found: dict[str, int]) -> dict[str, int]:
    return {name: lines for name, lines in found.items()
            if lines > (FUNCTION_LINES if ":" in name else MODULE_LINES) and lines > OVERSIZED.get(name, 0)}


def test_no_module_over_450_lines_and_no_function_over_80_beyond_those_listed_at_their_size():
    found = sizes(PACKAGE.parent)
    assert not too_long(found), f"over the limits: {too_long(found)}"
    fixed = {name for name in OVERSIZED if found.get(name, 0) <= (FUNCTION_LINES if ":" in name else MODULE_LINES)}
    assert not fixed, f"within the limits now: take them out of OVERSIZED: {sorted(fixed)}"


def test_the_size_check_names_a_long_module_and_a_long_function(tmp_path):
    (tmp_path / "cron_celery").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "dashboard_picture").write_text("x = 1\n")
    body = "".join(f"    x{n} = {n}\n" for n in range(81))
    (tmp_path / "cron_celery" / "long.py").write_text(
        f'def long():\n    """Its docstring,\n    not counted."""\n{body}' + "y = 0\n" * 400)
    assert too_long(sizes(tmp_path)) == {"cron_celery/long.py": 484, "cron_celery/long.py:long": 82}
