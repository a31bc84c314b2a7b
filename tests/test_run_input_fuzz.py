"""Whatever a person sends a run, it is taken or refused with a clear message, fuzzed with Hypothesis
against the real database and broker (issue 38: every field a person can type).

The run endpoint (``POST cron/run/<job>/``, JSON and form) and ``run_cron_task`` (``--param``,
``--at``, the date, ``--schedule``, ``--enqueue``) get values from the full Unicode range (NUL, lone
surrogates, right-to-left marks), times at and past both ends of the calendar, huge and negative
numbers, very long strings and JSON of every shape. The invariants:

- the endpoint answers 202 or 201 with the execution it recorded, or a 4xx whose JSON names the error;
  never a 500, and a refused request records nothing;
- the command finishes, or raises one ``CommandError`` of one line; nothing else escapes; input it
  refuses (exit code 1) records nothing, and a run it took and decided (a skip, a failure) records one
  execution;
- another job's run is taken as before after every example.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cron_celery.models import CronExecution
from tests.test_odd_input import post_run

pytestmark = pytest.mark.django_db

ANY_TEXT = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=30)
ODD_TEXT = st.one_of(ANY_TEXT, st.sampled_from([
    "", "\x00", "a\x00b", "\ud800", "\udcff", "\u200f\u202eeu", "x" * 5000, "\U0001d7d8", "\u0663", "-1",
    "99999999999999999999", "1e400", "NaN", "Infinity", "true", "null", "eu", "us"]))
TIMES = st.one_of(
    st.sampled_from(["9999-12-31T23:59:59.999999", "9999-12-31T23:59", "9999-12-31T23:59:59-05:00", "0001-01-01T00:00",
                     "0001-01-01T00:00+05:00", "0000-01-01", "10000-01-01T00:00", "2026-11-29T01:00\x00",
                     "2026-02-30T00:00", "2026-11-29T25:00", "2026-11-29", "9999-12-31", "0001-01-01", "-1"]),
    st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59)).map(
        lambda moment: moment.isoformat()),
    ODD_TEXT)
HUGE = st.one_of(st.integers(), st.sampled_from([0, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 10**30, 10**400]))
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), HUGE, st.floats(), ODD_TEXT, TIMES),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ODD_TEXT, inner, max_size=3), max_leaves=6)
#: param-report's parameters (tests/jobsapp/jobs_params.py) and names it does not take.
NAMES = st.sampled_from(["region", "day", "dry_run", "limit", "ratio", "since", "note"]) | ODD_TEXT
PARAMS = st.one_of(st.dictionaries(NAMES, JSON_VALUES, max_size=4), JSON_VALUES)
FIELDS = st.fixed_dictionaries({}, optional={
    "date": TIMES, "at": TIMES, "params": PARAMS, "force": st.booleans() | ODD_TEXT, "rerun": st.booleans() | ODD_TEXT,
    "cascade": st.booleans(), "schedule": st.booleans() | ODD_TEXT})
SETTINGS = settings(max_examples=int(os.environ.get("CRON_TEST_FUZZ_EXAMPLES", "60")), deadline=None,
                    database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _steady_run_is_taken(client: Any) -> None:
    """Another job's plain run, after the example: taken as ever."""
    answer = post_run(client, "nightly-report", json.dumps({"date": "2026-11-29"}))
    assert answer.status_code == 202, answer.content[:500]


def _sendable(text: str) -> bool:
    """A form field's text as a browser sends it: UTF-8 (no lone surrogate) without NUL."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def _dumped(fields: dict[str, Any]) -> str | None:
    try:
        return json.dumps(fields)
    except (ValueError, OverflowError):  # NaN is written (as JSON's extension), a huge float never
        return None


@SETTINGS
@given(fields=FIELDS, form=st.booleans())
def test_the_run_endpoint_takes_or_refuses_with_a_message_whatever_it_is_sent(client, queue, fields, form):
    before = CronExecution.objects.count()
    if form:
        body: Any = {key: json.dumps(value) if key == "params" else str(value) for key, value in fields.items()}
        if not all(_sendable(key) and _sendable(value) for key, value in body.items()):
            return  # no browser sends this as a form field (the JSON body carries it, escaped)
    else:
        body = _dumped(fields)
        if body is None:
            return
    answer = post_run(client, "param-report", body, form=form)
    assert answer.status_code in (201, 202, 400), (answer.status_code, answer.content[:1000])
    payload = answer.json()
    if answer.status_code == 400:
        assert isinstance(payload.get("error"), str) and payload["error"]
        assert CronExecution.objects.count() == before
    else:
        assert CronExecution.objects.filter(id=payload["execution_id"]).exists()
    _steady_run_is_taken(client)


def _param(name: str, value: Any) -> str:
    return f"{name}={value if isinstance(value, str) else json.dumps(value)}"


@SETTINGS
@given(params=st.lists(st.tuples(NAMES, JSON_VALUES), max_size=3), at=st.none() | TIMES,
       date=st.none() | TIMES, schedule=st.booleans(), enqueue=st.booleans())
def test_run_cron_task_takes_or_refuses_with_one_line_whatever_it_is_given(client, queue, params, at, date, schedule,
                                                                           enqueue):
    try:
        options: dict[str, Any] = {"param": [_param(name, value) for name, value in params]}
    except (ValueError, OverflowError):
        return
    if at is not None:
        options["at"] = at
    if schedule:
        options["schedule"] = True
    elif enqueue:
        options["enqueue"] = True
    args = ["param-report"] + ([date] if date is not None else [])
    before = CronExecution.objects.count()
    try:
        call_command("run_cron_task", *args, stdout=io.StringIO(), stderr=io.StringIO(), **options)
    except CommandError as error:
        assert str(error) and "\n" not in str(error), str(error)
        if error.returncode == 1:  # input it cannot take: nothing recorded
            assert CronExecution.objects.count() == before, str(error)
        else:  # taken, and decided: a skip (2) or a failed run is recorded, one execution
            assert CronExecution.objects.count() == before + 1, str(error)
    _steady_run_is_taken(client)
