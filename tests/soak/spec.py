"""The soak's jobs, as data both the job bodies and the checker read (no Django here).

Every body's fate is decided by its slot and attempt alone (``fails``, ``duration``), so the
checker knows what each attempt was meant to do, and every body counts itself in a marker file.
"""

from __future__ import annotations

import dataclasses
import zlib


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSpec:
    name: str
    code: str
    pattern: str  # standard | rerun_on_failure | always | rate_limited
    overlap: str  # skip | allow
    catch_up: str  # none | latest | all
    every: int  # seconds between slots
    max_retries: int = 0
    fail_percent: int = 0  # attempts that fail on purpose, decided by (slot, attempt)
    reported: bool = False  # a designed failure returns {"error": True} (not retried) instead of raising
    cooperative: bool = False  # calls run.check() between short steps
    shortest: float = 0.2  # body duration range, seconds
    longest: float = 1.0
    overrun_percent: int = 0  # attempts that sleep past the soft time limit
    soft_time_limit: float = 8.0
    time_limit: float = 10.0
    alert_after: int = 1

    @property
    def exclusive(self) -> bool:
        """Never two runs at once (overlap skip, or the rate_limited pattern)."""
        return self.overlap == "skip" or self.pattern == "rate_limited"


SPECS: tuple[JobSpec, ...] = (
    JobSpec(name="soak-standard", code="S01", pattern="standard", overlap="skip", catch_up="latest", every=2,
            max_retries=1, fail_percent=25, shortest=0.2, longest=1.5),
    JobSpec(name="soak-standard-allow", code="S02", pattern="standard", overlap="allow", catch_up="all", every=1,
            fail_percent=20, shortest=0.2, longest=2.2),
    JobSpec(name="soak-rerun", code="S03", pattern="rerun_on_failure", overlap="skip", catch_up="none", every=3,
            max_retries=2, fail_percent=40, shortest=0.2, longest=1.0, alert_after=2),
    JobSpec(name="soak-always-allow", code="S04", pattern="always", overlap="allow", catch_up="latest", every=2,
            fail_percent=10, shortest=0.1, longest=0.5),
    JobSpec(name="soak-always-skip", code="S05", pattern="always", overlap="skip", catch_up="all", every=2,
            max_retries=1, fail_percent=15, shortest=0.5, longest=2.8),
    JobSpec(name="soak-rate-limited", code="S06", pattern="rate_limited", overlap="allow", catch_up="latest",
            every=1, fail_percent=10, shortest=0.3, longest=1.6),
    JobSpec(name="soak-cooperative", code="S07", pattern="standard", overlap="skip", catch_up="latest", every=3,
            max_retries=1, fail_percent=15, reported=True, cooperative=True, shortest=1.0, longest=4.0),
    JobSpec(name="soak-time-limited", code="S08", pattern="standard", overlap="skip", catch_up="all", every=3,
            max_retries=1, fail_percent=10, shortest=0.3, longest=1.2, overrun_percent=15, soft_time_limit=2.0,
            time_limit=3.0),
)
BY_CODE = {spec.code: spec for spec in SPECS}


def _draw(spec: JobSpec, slot: int, attempt: int, what: str) -> int:
    """A number in 0..9999 fixed by the job, the slot (epoch seconds), the attempt and ``what``."""
    return zlib.crc32(f"{spec.code}:{slot}:{attempt}:{what}".encode()) % 10_000


def fails(spec: JobSpec, slot: int, attempt: int) -> bool:
    return _draw(spec, slot, attempt, "fail") < spec.fail_percent * 100


def overruns(spec: JobSpec, slot: int, attempt: int) -> bool:
    return _draw(spec, slot, attempt, "overrun") < spec.overrun_percent * 100


def duration(spec: JobSpec, slot: int, attempt: int) -> float:
    if overruns(spec, slot, attempt):
        return spec.soft_time_limit + 0.6
    return spec.shortest + (spec.longest - spec.shortest) * _draw(spec, slot, attempt, "duration") / 10_000


#: What a body's end line says it did, and the status its attempt must be recorded with.
OUTCOME_STATUS = {"ok": "SUCCEEDED", "fail": "FAILED", "leaselost": "FAILED", "interrupted": "FAILED",
                  "timeout": "TIMED_OUT"}
