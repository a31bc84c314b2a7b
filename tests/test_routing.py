"""``@cron_task(base=...)``: a ``TrackedTask`` subclass is the job's base class, anything else is
refused with a clear message; and the options every path sends a job's message with.

The real processes (a worker that consumes only custom queues, beat, the parent, the
reconciler) are in tests/faults/test_routing.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import celery
import pytest

from cron_celery import TrackedTask, cron_task, exceptions, register_task
from cron_celery.declaring import registry
from cron_celery.models import CronExecution, Status
from cron_celery.run import tasks
from tests.celery_app import app
from tests.jobsapp import jobs_routing

SLOT = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)


@pytest.fixture
def forget() -> Iterator[list[str]]:
    """Names of jobs a test declares; unregistered afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister(name)


class Greeting(TrackedTask):
    greeting = "hello from the base"
    queue = "a-queue-of-the-base"


@pytest.mark.django_db
def test_a_job_declared_with_base_a_tracked_task_subclass_is_built_on_it_and_runs(forget):
    forget.append("based-inline")

    def based_inline(run):
        return f"{celery.current_task.greeting} {run.slot:%H:%M}"

    task = cron_task(name="based-inline", code="Q900", base=Greeting, pattern="always")(based_inline)
    assert isinstance(task, Greeting) and isinstance(task, TrackedTask)
    assert task.job is registry.get("Q900") and task.acks_late and task.queue == "a-queue-of-the-base"
    result = task.apply(kwargs={"slot": SLOT.isoformat()}).get()
    row = CronExecution.objects.get(id=result["execution_id"])
    assert (row.status, row.message) == (Status.SUCCEEDED, "hello from the base 01:00")


def test_a_base_that_is_no_tracked_task_is_refused_before_anything_is_registered():
    class Plain(celery.Task):  # type: ignore[type-arg]
        pass

    for base in (Plain, object, "tests.jobsapp.jobs_routing.QueuedTrackedTask"):
        with pytest.raises(exceptions.ImproperlyDeclared, match=r"base= must be a subclass of .*TrackedTask"):
            cron_task(name="badly-based", code="Q901", base=base)(lambda run: None)
        with pytest.raises(exceptions.CronCeleryError):
            registry.get("Q901")


def test_register_task_refuses_base_because_the_decorated_class_is_the_base():
    with pytest.raises(exceptions.ImproperlyDeclared, match="the class it decorates is the task's base class"):
        @register_task("badly-based-class", "Q902", base=Greeting)
        class BadlyBased(TrackedTask):
            def execute(self, date):
                return "never"
    with pytest.raises(exceptions.CronCeleryError):
        registry.get("Q902")


def test_the_declared_base_job_of_the_jobs_module_is_routed_by_its_class():
    task = app.tasks[jobs_routing.own_base.name]
    assert isinstance(task, jobs_routing.QueuedTrackedTask)
    assert tasks.message_options(app, task.name) == {"queue": jobs_routing.OWN_QUEUE, "priority": 5}


def test_message_options_are_the_tasks_own_and_leave_the_rest_to_task_routes():
    own = tasks.message_options(app, jobs_routing.own_queue.name)
    assert own == {"queue": jobs_routing.OWN_QUEUE, "priority": jobs_routing.OWN_PRIORITY}
    # Nothing of its own: send_task's router applies CELERY_TASK_ROUTES.
    assert tasks.message_options(app, jobs_routing.ROUTED_TASK) == {}
    routed = app.amqp.router.route(tasks.message_options(app, jobs_routing.ROUTED_TASK), jobs_routing.ROUTED_TASK)
    assert (routed["queue"].name, routed["priority"]) == (jobs_routing.ROUTED_QUEUE, jobs_routing.ROUTED_PRIORITY)
    assert tasks.message_options(app, "not.a.registered.task") == {}
