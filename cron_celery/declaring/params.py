"""A job's parameters: the keyword-only arguments its function takes after ``run``.

Plain Python (no Django). The signature is read once, at declaration (``from_signature``), into
a tuple of ``Param``; from then on every way in is checked against it and turned into what an
execution row stores (JSON: dates and datetimes as ISO strings):

- ``from_text``: ``NAME=VALUE`` text, from ``run_cron_task --param`` (and forms);
- ``from_json``: a JSON object, from ``POST run/<job>/`` (``"params"``) and a periodic task's
  ``kwargs`` (``from_kwargs`` reads its text);
- ``from_json`` also takes Python values (a form's cleaned data, a direct ``delay()``).

``resolve`` turns a row's stored values back into the annotated Python types, with the declared
defaults for the parameters it leaves out: what the job's body receives as keyword arguments.
A name the job does not declare, a value that does not fit, or a required parameter with no value
raises ``exceptions.InvalidParams`` naming the parameter (``field``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cron_celery import exceptions, spelling
from cron_celery.declaring import storable

#: What a stored value is: JSON (a date or a datetime as its ISO string).
Json = str | int | float | bool | None

#: The kinds of parameter, by annotation (``choice``: ``Literal[...]``).
STR, INT, FLOAT, BOOL, DATE, DATETIME, CHOICE = "str", "int", "float", "bool", "date", "datetime", "choice"
_KINDS: dict[object, str] = {str: STR, int: INT, float: FLOAT, bool: BOOL, dt.date: DATE, dt.datetime: DATETIME}
#: Names the task's own call takes (``delay(slot=..., execution_date=..., force=..., rerun=...)``).
RESERVED = ("slot", "execution_date", "force", "rerun")
#: The words ``from_text`` reads as True or False.
TRUE, FALSE = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})
SUPPORTED = "str, int, float, bool, date, datetime or Literal[...] (each may be '| None')"


class _Missing:
    """The default of a parameter declared without one (it is required)."""

    def __repr__(self) -> str:
        return "<required>"


MISSING: Any = _Missing()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Param:
    """One parameter as declared: its name, its kind, whether None is accepted, the values a
    ``Literal`` allows, and its default (``MISSING``: none, the parameter is required)."""

    name: str
    kind: str
    optional: bool = False
    choices: tuple[str | int | bool, ...] = ()
    default: Any = MISSING

    @property
    def required(self) -> bool:
        return self.default is MISSING

    @property
    def type_text(self) -> str:
        """The annotation in words: ``str``, ``date | None``, ``'eu' | 'us'``."""
        base = " | ".join(_literal(choice) for choice in self.choices) if self.kind == CHOICE else self.kind
        return f"{base} | None" if self.optional else base

    @property
    def default_json(self) -> Json:
        """The default as it is stored and shown (``None`` also when there is none)."""
        return None if self.required else to_json(self, self.default)


def _literal(value: object) -> str:
    return json.dumps(value) if isinstance(value, bool) else repr(value)


def from_signature(func: Callable[..., Any], *, skip: int, job: str) -> tuple[Param, ...]:
    """The parameters of a job's function: its keyword-only arguments, after the ``skip`` leading
    positional ones (``run``; ``self, run`` for a bound task; ``self, date`` for ``execute``).
    ``*args`` and ``**kwargs`` are not parameters. Raises ``ImproperlyDeclared`` naming the
    parameter for one that is positional, a reserved name, an unsupported annotation, or a
    default that does not fit its type."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin or a callable without a signature: no parameters
        return ()
    found: list[Param] = []
    positional: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            if len(positional) < skip:
                positional.append(parameter.name)
                continue
            after = positional[-1] if positional else "the function's start"
            raise exceptions.ImproperlyDeclared(
                f"parameter {parameter.name!r} comes after {after} without '*': a job's parameters are keyword-only "
                f"(def {getattr(func, '__name__', 'job')}({', '.join(positional)}, *, {parameter.name}: str = ...)).",
                job=job)
        found.append(_declared(func, parameter, job))
    return tuple(found)


def _declared(func: Callable[..., Any], parameter: inspect.Parameter, job: str) -> Param:
    name = parameter.name
    if name in RESERVED:
        raise exceptions.ImproperlyDeclared(
            f"parameter {name!r}: the name is taken by the task's own call options ({', '.join(RESERVED)}); "
            "choose another.", job=job)
    if parameter.annotation is inspect.Parameter.empty:
        raise exceptions.ImproperlyDeclared(f"parameter {name!r} has no annotation: annotate it with {SUPPORTED}.",
                                            job=job)
    hint = _evaluated(func, name, parameter.annotation, job)
    kind, optional, choices = _kind(hint)
    if not kind:
        raise exceptions.ImproperlyDeclared(
            f"parameter {name!r}: the annotation {_spelled(parameter.annotation)} is not supported; use {SUPPORTED}.",
            job=job)
    declared = Param(name=name, kind=kind, optional=optional, choices=choices)
    if parameter.default is inspect.Parameter.empty:
        return declared
    try:
        default = _python(declared, _checked(declared, parameter.default, dt.UTC))
    except ValueError as error:
        raise exceptions.ImproperlyDeclared(
            f"parameter {name!r}: its default {parameter.default!r} does not fit {declared.type_text} ({error}).",
            job=job) from None
    if declared.kind == DATETIME and isinstance(parameter.default, dt.datetime):
        if parameter.default.tzinfo is None or parameter.default.utcoffset() is None:
            # A given value is always aware: a naive default would make the same parameter naive in
            # one run and aware in the next (comparing them raises TypeError in the body).
            raise exceptions.ImproperlyDeclared(
                f"parameter {name!r}: its default {parameter.default!r} is a naive datetime; give it a "
                "tzinfo (a given value always has one).", job=job)
        default = parameter.default  # as written
    return dataclasses.replace(declared, default=default)


def _spelled(annotation: object) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None) or repr(annotation)


def _evaluated(func: Callable[..., Any], name: str, annotation: object, job: str) -> object:
    """The annotation as a type: a string one (``from __future__ import annotations``) is read in
    the function's module, as ``typing.get_type_hints`` reads it."""
    if not isinstance(annotation, str):
        return annotation
    holder = types.SimpleNamespace(__annotations__={name: annotation})
    namespace = getattr(inspect.unwrap(func), "__globals__", {})
    try:
        return typing.get_type_hints(holder, globalns=namespace)[name]
    except Exception as error:  # whatever the text holds, it is this parameter's annotation that is wrong
        raise exceptions.ImproperlyDeclared(
            f"parameter {name!r}: cannot read its annotation {annotation!r} ({type(error).__name__}: {error}); "
            f"use {SUPPORTED}.", job=job) from None


def _kind(hint: object) -> tuple[str, bool, tuple[str | int | bool, ...]]:
    """(kind, optional, choices) of an annotation; kind '' when it is not supported."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        optional = len(members) < len(typing.get_args(hint))
        if len(members) != 1:
            return "", optional, ()
        hint = members[0]
    if typing.get_origin(hint) is typing.Literal:
        values = typing.get_args(hint)
        choices = tuple(value for value in values if value is not None)
        if not choices or not all(isinstance(value, str | int | bool) for value in choices):
            return "", optional, ()
        return CHOICE, optional or len(choices) < len(values), choices
    return _KINDS.get(hint, ""), optional, ()


def _checked(param: Param, value: object, tz: dt.tzinfo) -> Json:
    """``value`` (JSON, or the Python value itself) as this parameter stores it; ``ValueError``
    says why it does not fit."""
    if value is None:
        if param.optional:
            return None
        raise ValueError("a value is required (it is not optional)")
    kind = param.kind
    if kind == STR and isinstance(value, str):
        if problem := storable.json_problem(value):  # NUL, a lone surrogate: jsonb would refuse the row
            raise ValueError(f"the text cannot be stored: {problem}")
        return value
    if kind == INT and isinstance(value, int) and not isinstance(value, bool):
        if problem := storable.json_problem(value):
            raise ValueError(f"the number cannot be stored: {problem}")
        return value
    if kind == FLOAT and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"expected a finite number, not {value!r}")
        return float(value)
    if kind == BOOL and isinstance(value, bool):
        return value
    if kind == DATE:
        if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            return value.isoformat()
        if isinstance(value, str):
            return _date(value).isoformat()
    if kind == DATETIME:
        if isinstance(value, dt.datetime):
            return _aware(value, tz).isoformat()
        if isinstance(value, str):
            return _aware(_datetime(value), tz).isoformat()
    if kind == CHOICE:
        for choice in param.choices:
            if type(choice) is type(value) and choice == value:
                return choice
        raise ValueError(f"expected one of {', '.join(_literal(choice) for choice in param.choices)}, not {value!r}")
    raise ValueError(f"expected {_article(kind)}, not {_json_type(value)} {value!r}")


def _article(kind: str) -> str:
    return {STR: "a string", INT: "a whole number", FLOAT: "a number", BOOL: "true or false",
            DATE: "a date (YYYY-MM-DD)", DATETIME: "a date and time (ISO 8601, e.g. 2026-12-01T18:00)"}[kind]


def _json_type(value: object) -> str:
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(value), type(value).__name__)


def _date(text: str) -> dt.date:
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text.strip()):
        raise ValueError(f"expected a date (YYYY-MM-DD), not {text!r}")
    try:
        return dt.date.fromisoformat(text.strip())
    except ValueError as error:
        raise ValueError(f"{text!r} is not a date: {error}") from None


def _datetime(text: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected a date and time (ISO 8601, e.g. 2026-12-01T18:00), not {text!r}") from None


def _aware(moment: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    """A naive time is read in the job's timezone (as ``run_cron_task --at`` reads one)."""
    return moment if moment.tzinfo is not None and moment.utcoffset() is not None else moment.replace(tzinfo=tz)


def _python(param: Param, stored: Json) -> Any:
    """A stored value (already checked) as the annotated Python type."""
    if stored is None:
        return None
    if param.kind == DATE:
        return dt.date.fromisoformat(str(stored))
    if param.kind == DATETIME:
        return dt.datetime.fromisoformat(str(stored))
    return stored


def to_json(param: Param, value: object, tz: dt.tzinfo = dt.UTC) -> Json:
    """A Python value of the parameter as it is stored (``ValueError`` if it does not fit)."""
    return _checked(param, value, tz)


def parse_text(param: Param, text: str, tz: dt.tzinfo = dt.UTC) -> Json:
    """``NAME=VALUE`` text as the parameter stores it: ``null`` is None for an optional parameter
    (so is an empty value, except for a string); ``true``/``false`` (yes/no, on/off, 1/0) for a bool."""
    if param.optional and (text.strip().lower() == "null" or (text == "" and param.kind != STR)):
        return None
    kind = param.kind
    if kind == STR:
        return _checked(param, text, tz)
    if kind == INT:
        if not re.fullmatch(r"[+-]?[0-9]+", text.strip()):
            raise ValueError(f"expected a whole number, not {text!r}")
        return int(text.strip())
    if kind == FLOAT:
        try:
            number = float(text.strip())
        except ValueError:
            raise ValueError(f"expected a number, not {text!r}") from None
        return _checked(param, number, tz)
    if kind == BOOL:
        word = text.strip().lower()
        if word in TRUE or word in FALSE:
            return word in TRUE
        raise ValueError(f"expected true or false (also yes/no, on/off, 1/0), not {text!r}")
    if kind == CHOICE:
        for choice in param.choices:
            spelled = json.dumps(choice) if isinstance(choice, bool) else str(choice)
            if text.strip() == spelled:
                return choice
        raise ValueError(f"expected one of {', '.join(_literal(choice) for choice in param.choices)}, not {text!r}")
    return _checked(param, text, tz)


def _named(params: Iterable[Param], names: Iterable[str], job: str) -> dict[str, Param]:
    """The declared parameter of each name; an unknown one is refused, naming it and the known ones."""
    declared = {param.name: param for param in params}
    unknown = [name for name in names if name not in declared]
    if unknown:
        accepted = f"it accepts {', '.join(declared)}" if declared else "it declares no parameters"
        said = ", ".join(repr(name) for name in unknown)
        raise exceptions.InvalidParams(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {said} "
            f"({spelling.suggestion(unknown[0], declared)}{accepted}).", job=job, field=unknown[0])
    return declared


def from_text(params: Iterable[Param], pairs: Iterable[tuple[str, str]], *, job: str,
              tz: dt.tzinfo = dt.UTC) -> dict[str, Json]:
    """``(name, text)`` pairs (``--param name=text``) as stored values; a name given twice: the last wins."""
    given = dict(pairs)
    declared = _named(params, given, job)
    values: dict[str, Json] = {}
    for name, text in given.items():
        try:
            values[name] = parse_text(declared[name], text, tz)
        except ValueError as error:
            raise exceptions.InvalidParams(f"{name}: {error}.", job=job, field=name) from None
    return values


def parse_pair(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` split at its first ``=``; ``ValueError`` when there is none or no name."""
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise ValueError(f"expected NAME=VALUE (e.g. region=us), not {text!r}")
    return name.strip(), value


def from_json(params: Iterable[Param], values: object, *, job: str, tz: dt.tzinfo = dt.UTC,
              field: str = "params") -> dict[str, Json]:
    """A JSON object (or a mapping of Python values) as stored values. ``field`` names the whole
    when it is not an object (``params``, ``kwargs``)."""
    if not isinstance(values, Mapping) or not all(isinstance(name, str) for name in values):
        raise exceptions.InvalidParams(
            f"{field} must be an object of parameter names to values, not {_json_type(values)} {values!r}."[:500],
            job=job, field=field)
    declared = _named(params, values, job)
    stored: dict[str, Json] = {}
    for name, value in values.items():
        try:
            stored[name] = _checked(declared[name], value, tz)
        except ValueError as error:
            raise exceptions.InvalidParams(f"{name}: {error}."[:1000], job=job, field=name) from None
    return stored


def from_kwargs(params: Iterable[Param], text: str, *, job: str, tz: dt.tzinfo = dt.UTC) -> dict[str, Json]:
    """A periodic task's ``kwargs`` (JSON text; empty is ``{}``) as stored values, every required
    parameter given (a scheduled run has no other source for it)."""
    try:
        values = storable.loads(text or "{}")
    except ValueError as error:
        raise exceptions.InvalidParams(f"kwargs is not JSON ({error}).", job=job, field="kwargs") from None
    stored = from_json(params, values, job=job, tz=tz, field="kwargs")
    require(params, stored, job=job, source="the periodic task's kwargs")
    return stored


def require(params: Iterable[Param], given: Mapping[str, object] | None, *, job: str, source: str = "") -> None:
    """Refuse values that leave a required parameter out, naming it."""
    for param in params:
        if param.required and (given is None or param.name not in given):
            where = f" in {source}" if source else ""
            raise exceptions.InvalidParams(
                f"{param.name}: required ({param.type_text}, no default), and not given{where}.", job=job,
                field=param.name)


def resolve(params: Iterable[Param], stored: Mapping[str, object] | None, *, job: str,
            tz: dt.tzinfo = dt.UTC) -> dict[str, Any]:
    """What the body receives: every declared parameter, as its annotated type — the stored
    value, else the default. Raises ``InvalidParams`` when a stored value no longer fits (the
    code changed since the run was sent) or a required parameter has none."""
    declared = tuple(params)
    checked = from_json(declared, dict(stored or {}), job=job, tz=tz)
    require(declared, checked, job=job, source="this run's parameters")
    return {param.name: _python(param, checked[param.name]) if param.name in checked else param.default
            for param in declared}


def ordered(params: Iterable[Param], values: Mapping[str, object] | None) -> dict[str, object]:
    """``values`` in the order the job declares its parameters (jsonb keeps its own order), any
    name it does not declare (any more) after them."""
    values = values or {}
    names = [param.name for param in params if param.name in values]
    return {name: values[name] for name in [*names, *(name for name in values if name not in names)]}


def shown(values: Mapping[str, object] | None) -> str:
    """Stored values in a line: ``region=us, dry_run=true, day=null``; '' for none."""
    if not values:
        return ""
    return ", ".join(f"{name}={value if isinstance(value, str) else json.dumps(value)}"
                     for name, value in values.items())
