"""py-spy's raw stacks of a worker: parsed, reduced to its pool processes, drawn as a flame graph
(SVG) and summed up as where a tracked run's time goes (``bench/overhead.py --profile``).

py-spy writes one line per distinct stack, ``process PID:"CMD";thread (TID): NAME;frame;...;frame
COUNT`` (a child process's line names its parent's process first), each frame ``function (file)``
(``--nolineno``), outermost first. Everything here is pure: text in, values or SVG text out.
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

#: A stack's head: one ``process PID:"CMD";`` per generation (a pool process is named after its
#: parent, with ``--subprocesses``), then its thread.
_LINE = re.compile(r'^((?:process \d+:".*?";)+)thread \(([^)]*)\)(?::\s*([^;]*))?(?:;(.*))?$')
_PROCESS = re.compile(r'process (\d+):"')

#: The frame a pool process's main thread runs everything under (billiard's loop for jobs).
POOL_LOOP = "Worker.workloop (billiard/pool.py)"


@dataclasses.dataclass(frozen=True)
class Stack:
    pid: int
    thread: str  # the thread's name ("MainThread", "cron-celery-leases"), or its id
    frames: tuple[str, ...]  # outermost first
    count: int


def parse(text: str) -> list[Stack]:
    """py-spy's raw (collapsed) output; lines that are not stacks are left out."""
    stacks = []
    for line in text.splitlines():
        head, _, count = line.rstrip().rpartition(" ")
        found = _LINE.match(head)
        if not found or not count.isdigit():
            continue
        processes, tid, name, frames = found.groups()
        pid = _PROCESS.findall(processes)[-1]
        stacks.append(Stack(pid=int(pid), thread=(name or tid).strip(),
                            frames=tuple(frames.split(";")) if frames else (), count=int(count)))
    return stacks


def pool_main_threads(stacks: Iterable[Stack]) -> list[Stack]:
    """The main threads of the pool processes, each stack cut to what runs under billiard's loop
    (the frames the fork inherited from the parent are the same in every sample)."""
    kept = []
    for stack in stacks:
        if stack.thread == "MainThread" and POOL_LOOP in stack.frames:
            cut = stack.frames[stack.frames.index(POOL_LOOP) + 1:]
            kept.append(dataclasses.replace(stack, frames=cut))
    return kept


def total(stacks: Iterable[Stack]) -> int:
    return sum(stack.count for stack in stacks)


# ----------------------------------------------------------------------------- summary

#: Where the time of a pool process goes, first match wins: (label, frames that mark it). A
#: sample counts under the first label one of whose frames its stack holds; the order goes from
#: the narrowest (the SQL of the claim) to the widest (Celery around the task).
BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the claim (SQL, its commit included)", ("_claim_new (cron_celery/decisions/claims.py)",
                                              "begin (cron_celery/decisions/claims.py)")),
    ("the final write (SQL, its commit included)", ("finish_counting (cron_celery/decisions/finishes.py)",
                                                    "retry (cron_celery/decisions/finishes.py)")),
    ("the body (one Redis INCR)", ("tracked_noop (bench/tasks.py)",)),
    ("the lease thread: tracked and untracked", ("track (cron_celery/run/leases.py)",
                                                 "untrack (cron_celery/run/leases.py)")),
    ("the start and the end announced (listeners)", ("started (cron_celery/run/outcomes.py)",
                                                     "ended (cron_celery/run/events.py)",
                                                     "records (cron_celery/run/events.py)")),
    ("the soft time limit held off and put back", ("hold (cron_celery/run/limits.py)",
                                                   "release (cron_celery/run/limits.py)")),
    ("the rest of the run's own code (runs, tasks)", ("execute (cron_celery/run/runs.py)",
                                                      "__call__ (cron_celery/run/tasks.py)")),
    ("Celery around the task (tracing, acks, result, signals)", ("trace_task (celery/app/trace.py)",
                                                                 "fast_trace_task (celery/app/trace.py)")),
    ("waiting for the next task, and the pool's messaging", ("",)),
)


def bucket(frames: tuple[str, ...]) -> str:
    for label, marks in BUCKETS:
        if any(mark in frames for mark in marks if mark):
            return label
    return BUCKETS[-1][0]


def summary(stacks: list[Stack], top: int = 12) -> dict[str, Any]:
    """Shares of the pool processes' samples: by bucket (``BUCKETS``), and the functions that took
    the most within a task (inclusive, each counted once per sample), with their share of it."""
    whole = total(stacks)
    by_bucket: Counter[str] = Counter()
    in_task = 0
    functions: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for stack in stacks:
        label = bucket(stack.frames)
        by_bucket[label] += stack.count
        if label == BUCKETS[-1][0]:
            continue
        in_task += stack.count
        for frame in set(stack.frames):
            functions[frame] += stack.count
        if stack.frames:
            leaves[stack.frames[-1]] += stack.count
    return {
        "samples": whole,
        "in_task": in_task,
        "buckets": [{"what": label, "samples": by_bucket[label], "share": by_bucket[label] / whole if whole else 0.0}
                    for label, _ in BUCKETS],
        "functions": [{"function": name, "share_of_task": count / in_task if in_task else 0.0}
                      for name, count in functions.most_common(top)],
        "leaves": [{"function": name, "share_of_task": count / in_task if in_task else 0.0}
                   for name, count in leaves.most_common(top)],
    }


def summary_lines(found: dict[str, Any]) -> list[str]:
    """The summary as ``overhead.py --profile`` prints it."""
    lines = [f"{found['samples']:,} samples of the pool processes' main threads, "
             f"{found['in_task']:,} of them in a task:"]
    lines += [f"  {item['share']:6.1%}  {item['what']}" for item in found["buckets"]]
    lines.append("functions within a task (inclusive):")
    lines += [f"  {item['share_of_task']:6.1%}  {item['function']}" for item in found["functions"]]
    lines.append("where the samples ended (self):")
    lines += [f"  {item['share_of_task']:6.1%}  {item['function']}" for item in found["leaves"]]
    return lines


# -------------------------------------------------------------------------------- svg

WIDTH = 1200
ROW = 16
MARGIN = 10
TOP = 40  # room for the title


@dataclasses.dataclass
class _Node:
    name: str
    count: int = 0
    children: dict[str, _Node] = dataclasses.field(default_factory=dict)


def tree(stacks: Iterable[Stack], root: str) -> _Node:
    top = _Node(root)
    for stack in stacks:
        top.count += stack.count
        node = top
        for frame in stack.frames:
            node = node.children.setdefault(frame, _Node(frame))
            node.count += stack.count
    return top


def depth(node: _Node) -> int:
    return 1 + max((depth(child) for child in node.children.values()), default=0)


#: Fill colours by where a frame's code lives (the start of its file path).
COLOURS = (("cron_celery/", "#f0a050"), ("bench/", "#e8c060"), ("celery/", "#7cc47c"), ("kombu/", "#8fd18f"),
           ("billiard/", "#a4dca4"), ("django/", "#7fa8d8"), ("psycopg", "#b48ad8"), ("redis/", "#e07a7a"),
           ("pottery/", "#e07a7a"))


def colour(name: str) -> str:
    file = name[name.rfind("(") + 1:]
    for start, fill in COLOURS:
        if file.startswith(start):
            return fill
    return "#c8c8b4"


def svg(stacks: list[Stack], title: str) -> str:
    """A flame graph (the root at the bottom, callers below callees, widths proportional to
    samples); hovering a frame shows its samples and share."""
    root = tree(stacks, "all samples")
    rows = depth(root)
    height = TOP + rows * ROW + MARGIN
    scale = (WIDTH - 2 * MARGIN) / max(root.count, 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="#fbfbf6"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">{html.escape(title)}</text>',
        f'<text x="{MARGIN}" y="34" fill="#666">Colours: orange cron_celery, yellow the benchmark, green '
        'Celery/kombu/billiard, blue Django, purple psycopg, red redis-py; width = share of the samples.</text>',
    ]

    def draw(node: _Node, x: float, level: int) -> None:
        width = node.count * scale
        if width < 0.3:
            return
        y = height - MARGIN - (level + 1) * ROW
        share = node.count / max(root.count, 1)
        label = html.escape(node.name)
        parts.append(f'<g><title>{label}: {node.count:,} samples, {share:.1%}</title>'
                     f'<rect x="{x:.2f}" y="{y}" width="{width:.2f}" height="{ROW - 1}" fill="{colour(node.name)}" '
                     f'rx="2"/>')
        fits = int((width - 4) / 6.6)
        if fits >= 3:
            text = node.name if len(node.name) <= fits else node.name[:fits - 2] + ".."
            parts.append(f'<text x="{x + 2:.2f}" y="{y + ROW - 4}">{html.escape(text)}</text>')
        parts.append("</g>")
        offset = x
        for child in sorted(node.children.values(), key=lambda c: c.name):
            draw(child, offset, level + 1)
            offset += child.count * scale

    draw(root, MARGIN, 0)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
