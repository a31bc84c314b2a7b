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
    overlap: str  # skip | allow | buffer_one
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
    after: tuple[str, ...] = ()  # upstream codes: no schedule of its own, its slots are theirs
    group: str = ""  # a concurrency group (GROUP_LIMIT runs of its jobs at once)
    jitter: int = 0  # seconds: each slot is sent a fixed offset below it after the slot
    windowed: bool = False  # its slots run only inside CRON_SOAK_WINDOW (two epoch seconds)
    params: bool = False  # takes parameters (region, n): scheduled values are its periodic task's kwargs
    tracked: bool = False  # a plain Celery task with a periodic task of its own, tracked (code PT<id>)
    pause_after_failures: int | None = None  # the job pauses itself after so many final failures in a row

    @property
    def exclusive(self) -> bool:
        """Never two runs at once (overlap skip or buffer_one, or the rate_limited pattern)."""
        return self.overlap != "allow" or self.pattern == "rate_limited"


SPECS: tuple[JobSpec, ...] = (
    JobSpec(name="soak-standard", code="S01", pattern="standard", overlap="skip", catch_up="latest", every=2,
            max_retries=1, fail_percent=25, shortest=0.2, longest=1.5),
    JobSpec(name="soak-standard-allow", code="S02", pattern="standard", overlap="allow", catch_up="all", every=1,
            fail_percent=20, shortest=0.2, longest=2.2),
    JobSpec(name="soak-rerun", code="S03", pattern="rerun_on_failure", overlap="skip", catch_up="none", every=3,
            max_retries=2, fail_percent=40, shortest=0.2, longest=1.0, alert_after=2),
    JobSpec(name="soak-always-allow", code="S04", pattern="always", overlap="allow", catch_up="latest", every=2,
            fail_percent=10, shortest=0.1, longest=0.5),
    # The catch-up "all" jobs that allow no overlap (S05, S08, S11) run every missed slot, one at a time:
    # their bodies take at most half their interval on average, or no scheduler could catch up after the
    # beat and database outages the nemesis makes every few seconds (S05's 0.5 to 2.8 s every 2 s left
    # it minutes behind in ten minutes, and 565 slots open after the hour).
    JobSpec(name="soak-always-skip", code="S05", pattern="always", overlap="skip", catch_up="all", every=2,
            max_retries=1, fail_percent=15, shortest=0.2, longest=1.2),
    JobSpec(name="soak-rate-limited", code="S06", pattern="rate_limited", overlap="allow", catch_up="latest",
            every=1, fail_percent=10, shortest=0.3, longest=1.6, pause_after_failures=2),
    # overlap buffer_one: a 1 to 4 s body every 3 s, so one regular slot often waits and the next is skipped.
    JobSpec(name="soak-cooperative", code="S07", pattern="standard", overlap="buffer_one", catch_up="latest", every=3,
            max_retries=1, fail_percent=15, reported=True, cooperative=True, shortest=1.0, longest=4.0),
    JobSpec(name="soak-time-limited", code="S08", pattern="standard", overlap="skip", catch_up="all", every=3,
            max_retries=1, fail_percent=10, shortest=0.3, longest=1.2, overrun_percent=15, soft_time_limit=2.0,
            time_limit=3.0),
    # The features since: a fan-in after S01 and S04 (which share their schedule), two jobs
    # sharing a concurrency group, a jittered job, a windowed one, one with parameters (whose
    # kwargs the admin edits fault fuzzes, and which a person also runs by hand and at a time
    # given) and a plain periodic task tracked as a job.
    JobSpec(name="soak-fan-in", code="S09", pattern="standard", overlap="skip", catch_up="latest", every=2,
            after=("S01", "S04"), fail_percent=10, shortest=0.1, longest=0.8),
    JobSpec(name="soak-group-allow", code="S10", pattern="always", overlap="allow", catch_up="latest", every=1,
            group="soak-group", max_retries=1, fail_percent=15, shortest=0.5, longest=2.5),
    JobSpec(name="soak-group-skip", code="S11", pattern="standard", overlap="skip", catch_up="all", every=2,
            group="soak-group", fail_percent=10, shortest=0.3, longest=1.5),
    JobSpec(name="soak-jittered", code="S12", pattern="standard", overlap="skip", catch_up="latest", every=4,
            jitter=3, fail_percent=10, shortest=0.1, longest=0.6),
    JobSpec(name="soak-windowed", code="S13", pattern="always", overlap="allow", catch_up="all", every=1,
            windowed=True, fail_percent=10, shortest=0.1, longest=0.5),
    JobSpec(name="soak-params", code="S14", pattern="standard", overlap="allow", catch_up="latest", every=3,
            params=True, max_retries=1, fail_percent=10, shortest=0.2, longest=1.0),
    JobSpec(name="soak-tracked", code="PT", pattern="standard", overlap="allow", catch_up="none", every=2,
            tracked=True, shortest=0.1, longest=0.6),
)
BY_CODE = {spec.code: spec for spec in SPECS}
#: The concurrency groups' limits (the soak's CONCURRENCY_GROUPS).
GROUP_LIMITS = {"soak-group": 2}
#: The parameters' values a body may be given (S14): anything else must have been refused.
REGIONS = ("eu", "us")
#: The tracked plain task's periodic task, and the task it sends.
TRACKED_TASK = "soak tracked tick"
TRACKED_TASK_NAME = "tests.soak.tasks.plain_tick"


def spec_of(code: str) -> JobSpec | None:
    """The spec of a job code: a tracked periodic task's job is PT<its id>."""
    if code.startswith("PT") and code[2:].isdigit():
        return BY_CODE["PT"]
    return BY_CODE.get(code)


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
