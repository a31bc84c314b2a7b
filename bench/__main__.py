"""``python -m bench`` (what ``./scripts/bench`` runs): every benchmark, then docs/benchmarks.md."""

from bench.run import entry

entry()
