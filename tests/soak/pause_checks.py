"""The pauses' rules in the soak's history (docs/concepts.md, "A pause with a note and an end" and
"Pause after failures"):

- a pause with an end ends by itself at its end, by the database's clock: never before it
  (``PAUSE_ENDED_EARLY``), and not long after it unless the person resumed it first
  (``PAUSE_NOT_ENDED``: nothing ended it within ``END_BOUND`` seconds);
- a job declared with ``pause_after_failures`` pauses itself at its N-th final failure in a row and
  says so once (a ``PAUSED`` alert on that failure), not while it is paused, and again once a person
  resumed it and its streak goes on (``paused_alerts``, read by the alert rules).
"""

from __future__ import annotations

from typing import Any

from tests.soak import spec as specs
from tests.soak.history import Result, Row

#: Seconds after its end by which a pause must have ended: every beat and reconciler down, or the
#: database away, may hold the end back, not this long.
END_BOUND = 90.0
#: Seconds either side of a person's resume within which a failure may count as before or after it.
RESUME_SLACK = 2.0


def paused_alerts(spec: specs.JobSpec, finals: list[Row], lines: list[dict[str, Any]]
                  ) -> tuple[set[tuple[int, str]], set[tuple[int, str]]]:
    """The PAUSED alerts ``spec``'s final outcomes (in the order they were written) call for, and
    those that may or may not come (a failure that ended while the person's resume committed)."""
    expected: set[tuple[int, str]] = set()
    optional: set[tuple[int, str]] = set()
    if spec.pause_after_failures is None:
        return expected, optional
    resumes = sorted(line["t"] for line in lines if line.get("job") == spec.code and line["ev"] == "resume")
    in_a_row, paused_at, loose = 0, None, False
    for row in finals:
        moment = row.ended.timestamp() if row.ended else 0.0
        if paused_at is not None:
            resumed = next((t for t in resumes if t > paused_at), None)
            if resumed is not None and resumed - RESUME_SLACK <= moment:
                loose = loose or moment - resumed < RESUME_SLACK  # the product may have seen it either way
                paused_at = None
        if row.status == "SUCCEEDED":
            in_a_row, loose = 0, False
            continue
        in_a_row += 1
        pauses_now = paused_at is None and in_a_row >= spec.pause_after_failures
        if loose:  # till the streak ends, the product may have paused at any of its failures, or not
            optional.add((row.id, "PAUSED"))
        elif pauses_now:
            expected.add((row.id, "PAUSED"))
        if pauses_now:
            paused_at = moment
    return expected, optional


def check(lines: list[dict[str, Any]], pause_ends: list[tuple[str, float]], result: Result) -> None:
    """Each pause with an end (the person's ``pause-ends`` lines) against the audit log's rows of pauses
    that ended by themselves (job code, when, by the database's clock)."""
    last = max((line["t"] for line in lines), default=0.0)
    for code in {line["job"] for line in lines if line["ev"] == "pause-ends"}:
        mine = [line for line in lines if line.get("job") == code]
        ends = sorted(at for job, at in pause_ends if job == code)
        for index, line in enumerate(mine):
            if line["ev"] != "pause-ends":
                continue
            began = max((other["t"] for other in mine[:index] if other["ev"] == "pause"), default=line["t"])
            later = mine[index + 1:]
            following = next((other["t"] for other in later if other["ev"] == "pause"), float("inf"))
            resumed = next((other["t"] for other in later if other["ev"] == "resume"), float("inf"))
            ended = next((at for at in ends if began < at < following), None)
            until = line["until"]
            if ended is not None and ended < until and ended < resumed:
                result.flag("PAUSE_ENDED_EARLY", None, f"{code}: its pause until {until:.3f} ended by itself at "
                            f"{ended:.3f}")
            first = min(ended if ended is not None else float("inf"), resumed)
            if first > until + END_BOUND and until + END_BOUND < last:
                result.flag("PAUSE_NOT_ENDED", None, f"{code}: its pause until {until:.3f} had not ended "
                            f"{END_BOUND:g} s later")
