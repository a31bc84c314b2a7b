"""A job's parameters as plain Python (``cron_celery.declaring.params``): read from the signature at declaration,
then text, JSON and Python values checked against them, stored as JSON and turned back into the
annotated types. No database, no Celery."""

from __future__ import annotations

import datetime as dt
import json
import re
import typing
import zoneinfo
from typing import Literal, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cron_celery import TrackedTask, cron_task, exceptions, register_task
from cron_celery.declaring import params, registry
from cron_celery.run.runs import Run

pytestmark = pytest.mark.pure  # needs neither PostgreSQL nor Redis

AMSTERDAM = zoneinfo.ZoneInfo("Europe/Amsterdam")


def report(run: Run, *, region: Literal["eu", "us"] = "eu", day: dt.date | None = None, dry_run: bool = False,
           limit: int = 100, ratio: float = 0.5, since: dt.datetime | None = None, note: str = "",
           level: Optional[Literal[1, 2, 3]] = None) -> None:  # noqa: UP045  (Optional is one spelling we read)
    """The issue's example, with one parameter of each kind."""


REPORT = params.from_signature(report, skip=1, job="report")
BY_NAME = {param.name: param for param in REPORT}


# --- 1. The signature, once, at declaration ---------------------------------------------------------

def test_the_signature_is_read_into_one_plain_description_per_keyword_only_parameter():
    assert [(p.name, p.kind, p.optional, p.choices, p.default) for p in REPORT] == [
        ("region", "choice", False, ("eu", "us"), "eu"),
        ("day", "date", True, (), None),
        ("dry_run", "bool", False, (), False),
        ("limit", "int", False, (), 100),
        ("ratio", "float", False, (), 0.5),
        ("since", "datetime", True, (), None),
        ("note", "str", False, (), ""),
        ("level", "choice", True, (1, 2, 3), None),
    ]
    assert [p.type_text for p in REPORT[:3]] == ["'eu' | 'us'", "date | None", "bool"]
    assert not any(p.required for p in REPORT)


def test_a_parameter_without_a_default_is_required_and_star_args_are_not_parameters():
    def body(run: Run, *args: object, region: str, **kwargs: object) -> None: ...

    [region] = params.from_signature(body, skip=1, job="j")
    assert region.required and region.default is params.MISSING and region.default_json is None


def test_a_function_without_parameters_has_none():
    def plain(run: Run) -> None: ...

    assert params.from_signature(plain, skip=1, job="j") == ()
    assert params.from_signature(len, skip=1, job="j") == ()  # no signature to read


@pytest.mark.parametrize(("source", "fragment"), [
    ("def body(run, region: str = 'eu'): ...", "parameter 'region' comes after run without '*'"),
    ("def body(run, *, region=1): ...", "parameter 'region' has no annotation"),
    ("def body(run, *, tags: list[str] = []): ...", "parameter 'tags': the annotation list[str] is not supported"),
    ("def body(run, *, either: int | str = 1): ...", "parameter 'either': the annotation int | str is not supported"),
    ("def body(run, *, region: Literal['eu', 'us'] = 'xx'): ...",
     "parameter 'region': its default 'xx' does not fit 'eu' | 'us'"),
    ("def body(run, *, day: dt.date = None): ...", "parameter 'day': its default None does not fit date"),
    ("def body(run, *, limit: int = 1.5): ...", "parameter 'limit': its default 1.5 does not fit int"),
    ("def body(run, *, flag: bool = 0): ...", "parameter 'flag': its default 0 does not fit bool"),
    ("def body(run, *, ratio: float = float('nan')): ...", "parameter 'ratio': its default nan does not fit float"),
    ("def body(run, *, slot: str = ''): ...", "parameter 'slot': the name is taken"),
    ("def body(run, *, missing: 'NoSuchType' = 1): ...", "parameter 'missing': cannot read its annotation"),
    ("def body(run, *, since: dt.datetime = dt.datetime(2026, 1, 1)): ...",
     "parameter 'since': its default datetime.datetime(2026, 1, 1, 0, 0) is a naive datetime"),
])
def test_a_bad_declaration_is_refused_naming_the_parameter(source, fragment):
    namespace: dict[str, object] = {"Literal": Literal, "dt": dt}
    exec(source, namespace)  # a function as a user writes it
    with pytest.raises(exceptions.ImproperlyDeclared) as refused:
        params.from_signature(namespace["body"], skip=1, job="report")  # type: ignore[arg-type]
    assert "Job 'report' is declared incorrectly" in str(refused.value)
    assert fragment in str(refused.value)


def test_cron_task_and_register_task_refuse_a_positional_parameter_and_register_nothing():
    with pytest.raises(exceptions.ImproperlyDeclared, match="parameter 'region' comes after run without"):
        @cron_task(name="params-positional", code="PX01")
        def positional(run: Run, region: str = "eu") -> None: ...

    with pytest.raises(exceptions.ImproperlyDeclared, match="parameter 'region' comes after date without"):
        @register_task("params-class-positional", "PX02")
        class Positional(TrackedTask):
            def execute(self, date: dt.date, region: str = "eu") -> None:  # type: ignore[override]
                ...

    for name in ("params-positional", "params-class-positional"):
        with pytest.raises(exceptions.UnknownJob):
            registry.get(name)


def test_a_bound_task_and_a_class_style_job_skip_self():
    def bound(self: object, run: Run, *, region: str = "eu") -> None: ...

    class Job(TrackedTask):
        def execute(self, date: dt.date, *, partner: str, full: bool = False) -> None:  # type: ignore[override]
            ...

    assert [p.name for p in params.from_signature(bound, skip=2, job="j")] == ["region"]
    assert [(p.name, p.required) for p in params.from_signature(Job.execute, skip=2, job="j")] == [
        ("partner", True), ("full", False)]


def test_string_annotations_are_read_in_the_function_module():
    """``from __future__ import annotations`` (this module's): every annotation above is a string."""
    assert typing.get_type_hints(report)["day"] == dt.date | None
    assert BY_NAME["since"].kind == "datetime"


# --- 2. Text: run_cron_task --param, a form ----------------------------------------------------------

def test_text_is_read_as_each_kind_and_stored_as_json():
    stored = params.from_text(REPORT, [("region", "us"), ("day", "2026-11-30"), ("dry_run", "YES"), ("limit", " 7 "),
                                       ("ratio", "0.25"), ("since", "2026-12-01T18:00"), ("note", " as typed "),
                                       ("level", "2")], job="report", tz=AMSTERDAM)
    assert stored == {"region": "us", "day": "2026-11-30", "dry_run": True, "limit": 7, "ratio": 0.25,
                      "since": "2026-12-01T18:00:00+01:00", "note": " as typed ", "level": 2}
    assert json.loads(json.dumps(stored)) == stored  # it is JSON as it is


def test_null_and_empty_text_of_optional_parameters():
    assert params.from_text(REPORT, [("day", "null"), ("since", ""), ("level", "NULL")], job="r") == {
        "day": None, "since": None, "level": None}
    assert params.from_text(REPORT, [("note", "")], job="r") == {"note": ""}  # a string may be empty
    with pytest.raises(exceptions.InvalidParams, match="limit: expected a whole number, not 'null'"):
        params.from_text(REPORT, [("limit", "null")], job="r")


@pytest.mark.parametrize(("pair", "field", "fragment"), [
    (("region", "asia"), "region", "region: expected one of 'eu', 'us', not 'asia'"),
    (("dry_run", "maybe"), "dry_run", "dry_run: expected true or false"),
    (("limit", "7.5"), "limit", "limit: expected a whole number, not '7.5'"),
    (("limit", "\u0663"), "limit", "limit: expected a whole number"),  # an Arabic-Indic digit is no ASCII one
    (("day", "\u0662\u0660\u0662\u0666-11-30"), "day", "day: expected a date (YYYY-MM-DD)"),
    (("ratio", "inf"), "ratio", "ratio: expected a finite number"),
    (("ratio", "a lot"), "ratio", "ratio: expected a number"),
    (("day", "30/11/2026"), "day", "day: expected a date (YYYY-MM-DD)"),
    (("day", "2026-02-30"), "day", "day: '2026-02-30' is not a date"),
    (("since", "tomorrow"), "since", "since: expected a date and time"),
    (("level", "4"), "level", "level: expected one of 1, 2, 3"),
    (("colour", "red"), "colour", "unknown parameter 'colour' (it accepts region, day, dry_run, limit, ratio"),
])
def test_bad_text_is_refused_naming_the_parameter(pair, field, fragment):
    with pytest.raises(exceptions.InvalidParams) as refused:
        params.from_text(REPORT, [pair], job="report")
    assert refused.value.field == field
    assert str(refused.value).startswith("Job 'report' cannot take these parameters:")
    assert fragment in str(refused.value)


def test_a_pair_needs_a_name_and_an_equals_sign():
    assert params.parse_pair("note=a=b") == ("note", "a=b")
    assert params.parse_pair(" region =us") == ("region", "us")
    for bad in ("region", "=us", ""):
        with pytest.raises(ValueError, match="expected NAME=VALUE"):
            params.parse_pair(bad)


def test_an_unknown_name_close_to_a_declared_one_is_suggested():
    suggested = r"unknown parameter 'regoin' \(did you mean 'region'\? it accepts"
    with pytest.raises(exceptions.InvalidParams, match=suggested):
        params.from_text(REPORT, [("regoin", "us")], job="report")


def test_unknown_names_are_all_named_and_a_job_without_parameters_says_so():
    with pytest.raises(exceptions.InvalidParams, match=r"unknown parameters 'a', 'b' \(it accepts region"):
        params.from_json(REPORT, {"a": 1, "region": "us", "b": 2}, job="r")
    with pytest.raises(exceptions.InvalidParams, match=r"unknown parameter 'a' \(it declares no parameters\)"):
        params.from_json((), {"a": 1}, job="r")


# --- 3. JSON: the API, a periodic task's kwargs; Python values: a form, a direct call -----------------

def test_json_values_must_have_the_annotated_type():
    assert params.from_json(REPORT, {"limit": 3, "ratio": 2, "dry_run": False, "day": "2026-11-30",
                                     "since": "2026-12-01T17:00:00Z", "level": None}, job="r") == {
        "limit": 3, "ratio": 2.0, "dry_run": False, "day": "2026-11-30", "since": "2026-12-01T17:00:00+00:00",
        "level": None}
    for name, value, fragment in (("limit", "3", "expected a whole number, not string '3'"),
                                  ("limit", True, "expected a whole number, not boolean True"),
                                  ("dry_run", 1, "expected true or false, not number 1"),
                                  ("region", None, "a value is required"),
                                  ("level", True, "expected one of 1, 2, 3, not True"),
                                  ("ratio", [1], "expected a number, not list [1]")):
        with pytest.raises(exceptions.InvalidParams, match=re.escape(fragment)) as refused:
            params.from_json(REPORT, {name: value}, job="r")
        assert refused.value.field == name


def test_python_values_are_taken_as_they_are():
    moment = dt.datetime(2026, 12, 1, 18, 0)  # naive: in the job's timezone
    assert params.from_json(REPORT, {"day": dt.date(2026, 11, 30), "since": moment}, job="r", tz=AMSTERDAM) == {
        "day": "2026-11-30", "since": "2026-12-01T18:00:00+01:00"}
    with pytest.raises(exceptions.InvalidParams, match="day: expected a date"):
        params.from_json(REPORT, {"day": moment}, job="r")  # a datetime is no date


def test_the_whole_must_be_an_object():
    for value in ([1], "region=us", 3):
        with pytest.raises(exceptions.InvalidParams, match="kwargs must be an object") as refused:
            params.from_json(REPORT, value, job="r", field="kwargs")
        assert refused.value.field == "kwargs"


def test_kwargs_text_must_be_json_and_give_every_required_parameter():
    def sync(run: Run, *, partner: str, full: bool = False) -> None: ...

    declared = params.from_signature(sync, skip=1, job="sync")
    assert params.from_kwargs(declared, '{"partner": "acme"}', job="sync") == {"partner": "acme"}
    with pytest.raises(exceptions.InvalidParams, match="kwargs is not JSON") as not_json:
        params.from_kwargs(declared, "{partner: acme}", job="sync")
    assert not_json.value.field == "kwargs"
    for text in ("", "{}", '{"full": true}'):
        with pytest.raises(exceptions.InvalidParams, match=r"partner: required .* not given in the periodic task's"):
            params.from_kwargs(declared, text, job="sync")


# --- 4. Back to Python: what the body receives --------------------------------------------------------

def test_resolve_gives_every_parameter_its_type_and_the_defaults_for_the_rest():
    values = params.resolve(REPORT, {"region": "us", "day": "2026-11-30", "since": "2026-12-01T18:00:00+01:00",
                                     "ratio": 1}, job="r")
    assert values == {"region": "us", "day": dt.date(2026, 11, 30), "dry_run": False, "limit": 100, "ratio": 1.0,
                      "since": dt.datetime(2026, 12, 1, 17, 0, tzinfo=dt.UTC), "note": "", "level": None}
    assert type(values["ratio"]) is float and type(values["day"]) is dt.date
    assert params.resolve(REPORT, None, job="r")["region"] == "eu"
    assert params.resolve((), None, job="r") == {}


def test_resolve_refuses_stored_values_the_code_no_longer_takes():
    with pytest.raises(exceptions.InvalidParams, match="unknown parameter 'gone'") as unknown:
        params.resolve(REPORT, {"gone": 1}, job="r")
    assert unknown.value.field == "gone"
    with pytest.raises(exceptions.InvalidParams, match="limit: expected a whole number"):
        params.resolve(REPORT, {"limit": "seven"}, job="r")

    def sync(run: Run, *, partner: str) -> None: ...

    with pytest.raises(exceptions.InvalidParams, match=r"partner: required .* not given in this run's parameters"):
        params.resolve(params.from_signature(sync, skip=1, job="s"), {}, job="s")


def test_shown_is_one_line():
    assert params.shown({"region": "us", "dry_run": True, "day": None, "ratio": 0.5}) == \
        "region=us, dry_run=true, day=null, ratio=0.5"
    assert params.shown(None) == params.shown({}) == ""


# --- 5. Round trips, for any value -------------------------------------------------------------------

VALUES = {
    "region": st.sampled_from(["eu", "us"]),
    "day": st.none() | st.dates(),
    "dry_run": st.booleans(),
    "limit": st.integers(min_value=-(10 ** 12), max_value=10 ** 12),
    "ratio": st.floats(allow_nan=False, allow_infinity=False),
    "since": st.none() | st.datetimes(timezones=st.sampled_from([dt.UTC, AMSTERDAM])),
    "note": st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"])),  # what PostgreSQL stores
    "level": st.sampled_from([None, 1, 2, 3]),
}


@given(st.fixed_dictionaries({}, optional=VALUES))
def test_python_values_survive_json_storage_unchanged(values):
    stored = params.from_json(REPORT, values, job="r", tz=AMSTERDAM)
    assert json.loads(json.dumps(stored)) == stored
    back = params.resolve(REPORT, stored, job="r", tz=AMSTERDAM)
    for name, value in values.items():
        assert type(back[name]) is type(value)
        if isinstance(value, dt.datetime):  # the same instant (a time in a DST fold compares unequal across zones)
            assert back[name].astimezone(dt.UTC) == value.astimezone(dt.UTC)
        else:
            assert back[name] == value


@given(st.fixed_dictionaries({}, optional=VALUES))
def test_a_value_typed_as_text_reads_back_as_the_same_stored_value(values):
    stored = params.from_json(REPORT, values, job="r")
    typed = [(name, value if isinstance(value, str) else json.dumps(value)) for name, value in stored.items()]
    assert params.from_text(REPORT, typed, job="r") == stored


@given(st.text(), st.sampled_from(["\x00", "\ud800", "\udcff", "\udfff"]), st.text())
def test_text_postgresql_cannot_store_is_refused_every_way_in_naming_the_parameter(before, bad, after):
    """Issue 35 items 2 and 11: a NUL or a lone surrogate anywhere in a str parameter's value."""
    value = before + bad + after
    for refused in (lambda: params.from_json(REPORT, {"note": value}, job="r"),
                    lambda: params.from_text(REPORT, [("note", value)], job="r"),
                    lambda: params.from_kwargs(REPORT, json.dumps({"note": value}), job="r")):
        with pytest.raises(exceptions.InvalidParams) as error:
            refused()
        assert error.value.field == "note" and "cannot be stored" in str(error.value)
        str(error.value).encode("utf-8")  # the message itself can be stored and shown


def test_an_alert_says_at_most_five_hundred_characters_of_parameters():
    from cron_celery.alerts import delivery
    from cron_celery.models import CronExecution

    said = delivery._params_said(CronExecution(task_code="no-such-job", params={"note": "x" * 5000}, params_given=True))
    assert said.endswith(" … (given by hand)") and len(said) < delivery.PARAMS_CHARS + 30
    assert said.startswith("note=")
