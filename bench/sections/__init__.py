"""The sections of docs/benchmarks.md: how each benchmark works, and its figures, a module per benchmark.

Each ``*_ratios`` function computes the comparisons a section shows from one script's
JSON; each ``*_section`` function writes the section (prose, tables, ratios) as lines.
"""

from __future__ import annotations

from bench.latency_section import latency_section
from bench.sections.beat import *  # noqa: F403
from bench.sections.beat import beat_section
from bench.sections.history import *  # noqa: F403
from bench.sections.history import history_section
from bench.sections.locks import *  # noqa: F403
from bench.sections.locks import locks_section
from bench.sections.overhead import *  # noqa: F403
from bench.sections.overhead import overhead_section

SECTIONS = (overhead_section, locks_section, beat_section, latency_section, history_section)
