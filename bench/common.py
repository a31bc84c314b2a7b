"""What the benchmark scripts share: errors, output, the results file and the entry point."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class BenchError(RuntimeError):
    pass


def log(text: str) -> None:
    print(text, flush=True)


def write_results(name: str, started_at: dt.datetime, payload: dict[str, Any], path: Path | None) -> None:
    """Write the run's figures as JSON to ``path`` or ``bench/results/NAME-<time>.json``."""
    out = path or ROOT / "bench" / "results" / f"{name}-{started_at:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    log(f"results written to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


def run(main: Callable[[], int]) -> None:
    """Run a benchmark's ``main``; Ctrl-C or SIGTERM and BenchError end it with a message."""
    try:
        sys.exit(main())
    except KeyboardInterrupt as interrupted:  # the script's own finally blocks have cleaned up
        print(f"interrupted ({interrupted or 'Ctrl-C'})", file=sys.stderr)
        sys.exit(130)
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        sys.exit(1)
