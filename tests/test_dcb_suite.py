"""django-celery-beat's own scheduler tests pass on PostgreSQL with cron_celery installed and tracking on,
as they pass without it, except where tracking changes by design what they check.

The issue: "django-celery-beat 2.9's own scheduler test suite still passes with tracking on, on
PostgreSQL, as it does without it." Their tests are not in the installed wheel and are not copied into
this repository: the sdist of the installed django-celery-beat is downloaded (``pip download``, kept
under the system's temporary directory so that the next run does not download it again), its test
project and tests are unpacked (their package is not: the installed one is what runs), and their
scheduler tests (``t/unit/test_schedulers.py``) run in a pytest of their own against this machine's
PostgreSQL, four times side by side, each in a test database of its own:

- ``shipped``: as django-celery-beat ships them (their settings, their ``DatabaseScheduler``);
- ``installed``: cron_celery installed after django_celery_beat, its migrations applied (its tables,
  and its triggers on django_celery_beat's tables), ``TRACK_PERIODIC_TASKS = True``; their scheduler;
- ``tracked``: as ``installed``, and every scheduler their tests make is ``cron_celery.beat.Scheduler``
  (their ``DatabaseScheduler`` is ours): every periodic task of theirs is tracked;
- ``none-chosen``: as ``tracked``, with ``TRACK_PERIODIC_TASKS`` a list naming none of their periodic
  tasks: tracking is on and looks at every read, and their tests exercise the rest of our scheduler.

tests/dcb_suite/ holds their settings' changes (``dcb_settings``: the database, cron_celery, the
setting) and a plugin (``dcb_plugin``: the scheduler put in place; their tests run as transactional
tests, as a beat runs, since on PostgreSQL their scheduler's ``close_old_connections`` would close a
test's own transaction; a mark of theirs that pytest 9 refuses ignored, as pytest 8 did; and a report of
how each test ended and of what cron_celery logged at WARNING or above).

The first two modes must pass whole; the others must fail exactly the tests named in
EXPECTED_FAILURES, each for the reason given there and with the error that reason gives; two tests of
theirs are left out of every mode, for the reasons in NOT_RUN. cron_celery must log nothing but what
EXPECTED_RECORDS allows (our scheduler logs and goes on where a beat must not stop, so a test of theirs
could pass over an error of ours). A failed download, a missing test dependency or a missing PostgreSQL
fails. (It found one: a tracked task whose task is not registered was said to be able to drive its job
again, then at once not, each time a beat started; fixed in the same change as this test.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import django_celery_beat
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
HELPERS = Path(__file__).with_name("dcb_suite")
VERSION = importlib.metadata.version("django-celery-beat")
CACHE = Path(tempfile.gettempdir()) / "cron-celery-dcb-sdist"
SUITE = "t/unit/test_schedulers.py"
MODES = ("shipped", "installed", "tracked", "none-chosen")
SWAPPED = frozenset({"tracked", "none-chosen"})
#: Their scheduler tests number 62 in 2.9.0; fewer than this would mean the suite was not found whole.
AT_LEAST = 50
#: How long one mode may take (their tests take 20 to 40 s each, four at once on two cores).
CHILD_TIMEOUT = 600


def _their(name: str) -> str:
    return f"{SUITE}::{name}"


#: Their tests left out in every mode, and why.
NOT_RUN = {
    _their("test_DatabaseScheduler::test_crontab_with_start_time_tick"):
        "calls tick() in a loop, without sleeping, until a crontab minute one to two minutes ahead comes "
        "(its iteration cap is never counted up): one to two minutes of a busy loop per mode. It passes as "
        "shipped and in the mode none-chosen; in the mode tracked its heap is empty (IndexError), both of "
        "its periodic tasks being tracked",
    _their("test_DatabaseScheduler::test_heap_always_return_the_first_item"):
        "fails as shipped with the installed Celery 5.7 and sleeps 12 to 30 s: it asserts that a disabled "
        "entry at the top of the heap keeps the others from ever running, which Celery 5.7's "
        "Scheduler.tick no longer does (celery/celery#7649: the entry is put back at its retry time)",
}


@dataclasses.dataclass(frozen=True)
class Expected:
    """A failure of one of their tests that a mode causes by design."""

    reason: str
    #: A regular expression the test's error (as pytest sums it up) must match.
    error: str


TRACKED = ("TRACK_PERIODIC_TASKS = True tracks every periodic task that is no cron job's: our scheduler links "
           "each to a job row when it reads the schedule, and from then on our beat dispatches it and "
           "DatabaseScheduler's schedule no longer holds it (a clocked or solar one stays there, recorded as "
           "it fires)")
GONE = re.escape("KeyError: 'thefoo") + r"\d+'"

#: Their tests that fail in each mode by design, and why. Any other failure is a defect.
EXPECTED_FAILURES: dict[str, dict[str, Expected]] = {
    "shipped": {},
    "installed": {},
    "tracked": {
        _their("test_DatabaseSchedulerFromAppConf::test_periodic_task_model_enabled_schedule"): Expected(
            f"{TRACKED}: celery.backend_cleanup and the beat_schedule entry it expects are tracked, so the "
            "schedule is empty", r"assert 0 == 2"),
        _their("test_DatabaseSchedulerFromAppConf::test_periodic_task_model_disabled_schedule"): Expected(
            f"{TRACKED}: celery.backend_cleanup, the one entry it expects, is tracked", r"assert \{\}"),
        _their("test_DatabaseScheduler::test_all_as_schedule"): Expected(
            f"{TRACKED}: of the nine entries it expects only the solar and the clocked ones are there, with "
            "celery.backend_cleanup (added after the read, tracked at the next)",
            r"Task mismatch\. .* Got: (?=\{[^}]*'celery\.backend_cleanup')\{'[^']+', '[^']+', '[^']+'\}"),
        _their("test_DatabaseScheduler::test_schedule_changed"): Expected(
            f"{TRACKED}: the interval task it edits is not in the schedule", GONE),
        _their("test_DatabaseScheduler::test_reserve"): Expected(
            f"{TRACKED}: the interval task it reserves is not in the schedule", GONE),
        _their("test_DatabaseScheduler::test_sync_not_saves_last_run_at_while_schedule_changed"): Expected(
            f"{TRACKED}: the interval task it syncs is not in the schedule", GONE),
        _their("test_DatabaseScheduler::test_sync_saves_last_run_at"): Expected(
            f"{TRACKED}: the interval task it syncs is not in the schedule", GONE),
        _their("test_DatabaseScheduler::test_sync_syncs_before_save"): Expected(
            f"{TRACKED}: the interval task it reserves is not in the schedule", GONE),
        _their("test_DatabaseScheduler::test_periodic_task_disabled_and_enabled"): Expected(
            f"{TRACKED}: the interval task it disables is not in the schedule", GONE),
        _their("test_DatabaseScheduler::test_periodic_task_disabled_while_reserved"): Expected(
            f"{TRACKED}: the interval task it reserves is not in the schedule", GONE),
        _their("test_DatabaseScheduler::test_starttime_trigger"): Expected(
            f"{TRACKED}: neither celery.backend_cleanup nor its new interval task is on the heap", r"assert 0 == 2"),
    },
    "none-chosen": {
        _their("test_DatabaseScheduler::test_reserve"): Expected(
            "our reserve() writes the entry's last run and run count to its row before the send, compared "
            "and set (beat/plain_tasks.py: so that no other beat sends it again), and takes it out of "
            "_dirty: nothing is left for DatabaseScheduler's lazy sync, whose pending write the test "
            "asserts", r"assert 'thefoo\d+' in set\(\)"),
    },
}

LEADER = ("WARNING", r"beat \S+ is now the leader \(database lease\)$")
LINKED = ("WARNING", r"cron_celery: \d+ periodic task\(s\) tracked as jobs from now on: ")
UNLINKED = ("WARNING", r"cron_celery: \d+ periodic task\(s\) no longer tracked \(gone, or left out by "
                       r"TRACK_PERIODIC_TASKS\)")
UNREGISTERED = (r"its task '[^']*' is not registered with the Celery app \(a typo, or an app that is not "
                r"installed\?\): every worker drops its messages")
SAID = ("ERROR", rf"cron job (\S+): its periodic task's schedule cannot drive it \({UNREGISTERED}\); "
                 r"(sent as scheduled|disabled|paused) until it is fixed$")
OUTSTANDING = ("ERROR", rf"cron job \S+: its schedule edit is still not applied \({UNREGISTERED}\); "
                        r"(on its previous schedule|paused)$")
#: What cron_celery may log at WARNING or above in each mode (level, regular expression): a beat's
#: scheduler taking the lead (each test's scheduler is a new beat) and, where their periodic tasks are
#: tracked, their linking and unlinking (a test deletes some) and, as an ERROR, that the task each names
#: is not one their Celery app registers ("djcelery.unittest.add<N>", or none): a tracked periodic
#: task's problem, said when its job row is read and again at every beat's start, by design. Anything
#: else (a failed round or read our scheduler went on after, say) is a defect.
EXPECTED_RECORDS: dict[str, tuple[tuple[str, str], ...]] = {
    "shipped": (),
    "installed": (),
    "tracked": (LEADER, LINKED, UNLINKED, SAID, OUTSTANDING),
    "none-chosen": (LEADER,),
}
#: Their tests that pass only when two of their calls come within a second or two of each other.
#: One that fails in a mode where it should pass is run again alone in that mode, and must pass then:
#: a machine too busy to keep their timing, not a defect (said in the output).
TIMING = {
    _their("test_DatabaseScheduler::test_starttime_trigger"):
        "saves an entry whose start time is 2 s ahead, ticks, sleeps 2 s and ticks again, expecting the entry "
        "then past its start (a loaded run failed it in the mode none-chosen: 'thefoo410' == 'thefoo412')",
}


@dataclasses.dataclass
class Run:
    mode: str
    returncode: int
    seconds: float
    output: str
    report: dict[str, Any]
    #: Their TIMING tests that failed in the whole run and were then run alone: the first error.
    again: dict[str, str] = dataclasses.field(default_factory=dict)

    def tail(self) -> str:
        return f"--- {self.mode}: exit {self.returncode}, {self.seconds:.0f} s; its output ends:\n{self.output[-6000:]}"


def sdist() -> Path:
    """The sdist of the installed django-celery-beat, downloaded once into CACHE (a lock keeps the
    test sessions that run side by side from downloading it twice)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    kept = CACHE / f"django_celery_beat-{VERSION}.tar.gz"
    with open(CACHE / "download.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not kept.exists():
            with tempfile.TemporaryDirectory(dir=CACHE) as into:
                result = subprocess.run(
                    [sys.executable, "-m", "pip", "download", f"django-celery-beat=={VERSION}", "--no-binary", ":all:",
                     "--no-deps", "--disable-pip-version-check", "--dest", into],
                    capture_output=True, text=True, timeout=600, check=False)
                found = sorted(Path(into).glob("*.tar.gz"))
                assert result.returncode == 0 and len(found) == 1, \
                    f"could not download the sdist of django-celery-beat {VERSION}:\n{result.stdout}\n{result.stderr}"
                os.replace(found[0], kept)
    return kept


def unpack(archive: Path, into: Path) -> Path:
    """Their test project and tests (``t/``) and their pytest settings (``setup.cfg``: ``python_classes``
    finds their ``test_*`` classes) in ``into``; not their package, so the installed one is imported."""
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            top = members[0].name.split("/")[0]
            wanted = [member for member in members
                      if member.name == f"{top}/setup.cfg" or member.name.startswith(f"{top}/t/")]
            assert f"{top}/{SUITE}" in {member.name for member in wanted}, \
                f"the sdist of django-celery-beat {VERSION} has no {SUITE}"
            tar.extractall(into, members=wanted, filter="data")
    except tarfile.TarError:
        archive.unlink()  # a damaged download: the next run downloads it again
        raise
    return into / top


def child_env(mode: str, report: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_", "DJANGO_SETTINGS_MODULE", "CRON_CELERY_TEST_DB"))}
    prefix = os.environ.get("CRON_TEST_DATABASE_PREFIX", "cron_celery")
    env.update(
        CRON_DCB_MODE=mode,
        CRON_DCB_DATABASE=f"{prefix}_dcb_{mode.replace('-', '_')}",
        CRON_DCB_REPORT=str(report),
        DATABASE_URL=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cron_celery"),
        # dcb_settings and dcb_plugin as top-level modules (not through the package tests, whose Celery app
        # their tests must not see), and this checkout's cron_celery.
        PYTHONPATH=os.pathsep.join([str(HELPERS), str(ROOT)]),
    )
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Their scheduler tests, run once in each mode, the four side by side."""
    for module, package in (("pytest_django", "pytest-django"), ("pytest_timeout", "pytest-timeout"),
                            ("ephem", "ephem")):
        assert importlib.util.find_spec(module) is not None, \
            f"their scheduler tests need {package} (their requirements/test.txt; in this project's dev extras)"
    base = tmp_path_factory.mktemp("dcb")
    src = unpack(sdist(), base)
    done: dict[str, Run] = {}
    with contextlib.ExitStack() as stack:
        started: dict[str, tuple[subprocess.Popen[str], IO[str]]] = {}
        began = time.monotonic()
        for mode in MODES:
            log = stack.enter_context(open(base / f"{mode}.log", "w+", encoding="utf-8"))
            command = their_pytest(src, base / f"tmp-{mode}", SUITE)
            for test in NOT_RUN:
                command += ["--deselect", test]
            process = subprocess.Popen(command, cwd=src, env=child_env(mode, base / f"{mode}.json"), stdout=log,
                                       stderr=subprocess.STDOUT, text=True)
            stack.callback(_end, process)
            started[mode] = (process, log)
        while len(done) < len(started):
            for mode, (child, output) in started.items():
                late = time.monotonic() - began > CHILD_TIMEOUT
                if mode in done or (child.poll() is None and not late):
                    continue
                _end(child)  # the four are killed when the time is up
                output.seek(0)
                report = base / f"{mode}.json"
                found = json.loads(report.read_text(encoding="utf-8")) if report.exists() else {}
                done[mode] = Run(mode, child.returncode, time.monotonic() - began, output.read(), found)
            time.sleep(0.2)
    for run in done.values():
        for test in sorted(TIMING):
            ended = run.report.get("ran", {}).get(test, {})
            if ended.get("outcome") == "failed" and test not in EXPECTED_FAILURES[run.mode]:
                run.again[test] = ended.get("error", "")
                run.report["ran"][test] = alone(src, base, run.mode, test)
                print(f"{run.mode}: {test} failed ({run.again[test]}), then {run.report['ran'][test]['outcome']} "
                      f"alone: {TIMING[test]}")
    for run in done.values():
        passed = sum(1 for test in run.report.get("ran", {}).values() if test["outcome"] == "passed")
        print(f"{run.mode}: {len(run.report.get('ran', {}))} ran, {passed} passed, exit {run.returncode}, "
              f"done after {run.seconds:.0f} s")
    return done


def their_pytest(src: Path, basetemp: Path, target: str) -> list[str]:
    return [sys.executable, "-m", "pytest", target, "-c", str(src / "setup.cfg"), "--rootdir", str(src),
            "--ds", "dcb_settings", "-p", "dcb_plugin", "-p", "no:cacheprovider", "--create-db",
            "--timeout", "120", "-q", "-rfE", "-W", "ignore::DeprecationWarning", "--basetemp", str(basetemp)]


def alone(src: Path, base: Path, mode: str, test: str) -> dict[str, Any]:
    """One test of theirs run again by itself in a mode: how it ended (as the mode's report says)."""
    report = base / f"{mode}-again.json"
    subprocess.run(their_pytest(src, base / f"tmp-{mode}-again", test), cwd=src, env=child_env(mode, report),
                   capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False)
    found = json.loads(report.read_text(encoding="utf-8")) if report.exists() else {}
    return dict(found.get("ran", {}).get(test, {"outcome": "not run", "error": "no report"}))


def _end(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


@pytest.mark.parametrize("mode", MODES)
def test_their_scheduler_tests(runs: dict[str, Run], mode: str) -> None:
    """Their scheduler tests ran whole in this mode, against the installed django-celery-beat and the
    scheduler the mode names, and failed exactly where the mode makes them fail by design."""
    run = runs[mode]
    report = run.report
    assert report.get("mode") == mode and run.returncode in (0, 1), \
        f"their tests did not run to the end in the mode {mode}\n{run.tail()}"
    assert Path(report["django_celery_beat"]).resolve() == Path(django_celery_beat.__file__).resolve(), run.tail()
    scheduler = "cron_celery.beat.Scheduler" if mode in SWAPPED else "django_celery_beat.schedulers.DatabaseScheduler"
    assert report["scheduler"] == scheduler, run.tail()

    assert sorted(report["deselected"]) == sorted(NOT_RUN), f"their tests left out are not those named\n{run.tail()}"
    selected = set(report["selected"])
    assert len(selected) >= AT_LEAST, f"only {len(selected)} of their tests were collected\n{run.tail()}"
    assert set(report["ran"]) == selected, f"not every test of theirs collected ran\n{run.tail()}"
    assert selected == set(runs["shipped"].report.get("selected", ())), "the modes did not run the same tests"
    skipped = sorted(test for test, ended in report["ran"].items() if ended["outcome"] == "skipped")
    assert not skipped, f"skipped: {skipped}\n{run.tail()}"

    failed = {test: ended["error"] for test, ended in report["ran"].items() if ended["outcome"] == "failed"}
    expected = EXPECTED_FAILURES[mode]
    unexpected = {test: error for test, error in failed.items() if test not in expected}
    passed_instead = sorted(set(expected) - set(failed))
    assert not unexpected and not passed_instead, (
        f"mode {mode}: failed, not expected to:\n"
        + "".join(f"  {test}\n    {error}\n" for test, error in sorted(unexpected.items()))
        + f"passed, expected to fail: {passed_instead}\n{run.tail()}")
    for test, why in expected.items():
        assert re.search(why.error, failed[test]), \
            f"{test} failed, but not as expected ({why.reason}): {failed[test]}\n{run.tail()}"
    assert run.returncode == (1 if expected or run.again else 0), run.tail()


@pytest.mark.parametrize("mode", MODES)
def test_cron_celery_logs_only_what_is_expected(runs: dict[str, Run], mode: str) -> None:
    """While their tests ran, cron_celery logged nothing beyond what its mode gives: nothing with their
    own scheduler; with ours, a new leader per test and, where their periodic tasks are tracked, their
    linking (seen happening) and their unregistered tasks."""
    run = runs[mode]
    records = run.report.get("records")
    assert records is not None, run.tail()
    allowed = EXPECTED_RECORDS[mode]
    stray = [record for record in records if not any(
        record["level"] == level and re.match(pattern, record["message"]) for level, pattern in allowed)]
    assert not stray, f"cron_celery logged, in the mode {mode}:\n" + "\n".join(
        f"  {record['test']}: {record['level']} {record['logger']}: {record['message']}" for record in stray)
    if mode == "tracked":
        assert any(re.match(LINKED[1], record["message"]) for record in records), "no periodic task was tracked"
