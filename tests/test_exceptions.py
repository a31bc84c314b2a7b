"""Every cron_celery exception survives pickling as itself: a prefork worker's child hands the
exception of a run to its parent that way, and Celery's result backends with the pickle
serializer store it so. A class whose message has fields (``{name!r}``) is built from them."""

from __future__ import annotations

import inspect
import pickle
import string

import pytest

from cron_celery import exceptions

pytestmark = pytest.mark.pure  # needs neither PostgreSQL nor Redis

CLASSES = sorted((cls for _, cls in inspect.getmembers(exceptions, inspect.isclass)
                  if issubclass(cls, exceptions.CronCeleryError)), key=lambda cls: cls.__name__)


def template_fields(cls: type[exceptions.CronCeleryError]) -> list[str]:
    template = vars(cls).get("message_template") or cls.__doc__ or ""
    return [field for _, field, _, _ in string.Formatter().parse(template) if field]


def build(cls: type[exceptions.CronCeleryError]) -> exceptions.CronCeleryError:
    if cls is exceptions.JobFailed:
        return exceptions.JobFailed("partner down", error_code="HTTP_503")
    if cls is exceptions.InvalidParams:
        return exceptions.InvalidParams("'limit' must be an int", job="nightly", field="limit")
    return cls("and a detail.", **{field: f"value of {field}" for field in template_fields(cls)})


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_an_exception_pickles_as_itself_with_its_message_context_and_code(cls):
    raised = build(cls)
    copy = pickle.loads(pickle.dumps(raised))
    assert type(copy) is cls
    assert str(copy) == str(raised) and copy.args == raised.args
    assert getattr(copy, "error_code", None) == getattr(raised, "error_code", None)
    assert getattr(copy, "context", None) == getattr(raised, "context", None)


def test_every_field_of_a_message_is_filled_in_the_test_above():
    lost = build(exceptions.LockLost)
    assert "value of name" in str(lost) and "{" not in str(lost)
    assert len(CLASSES) >= 20
