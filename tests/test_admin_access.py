"""django-celery-beat's admin pages, where they touch a cron job: a periodic task that drives a cron
job (and a schedule row such a task uses) is changed — paused, resumed, its parameters, window or
one_off edited, deleted, or acted on in bulk — only by a user who also holds cron_celery's operate
permission (``models.OPERATE_PERMISSION``, what the jobs dashboard's Pause and Run now ask); without
it the page is read-only and every such request is refused with nothing changed. Plain periodic
tasks keep django-celery-beat's own permissions. Real users, real permissions, Django's test client,
real PostgreSQL (the triggers that pause a job with its task run)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db.models import Q
from django.test import Client
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from cron_celery import Run
from cron_celery.beat import schedule_sync
from cron_celery.declaring import params
from cron_celery.models import CronJob
from tests.admin_forms import filled

pytestmark = pytest.mark.django_db
T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
TASKS = "/admin/django_celery_beat/periodictask/"
CRONTABS = "/admin/django_celery_beat/crontabschedule/"
REFUSED = "cron_celery.change_cronjob"  # named in the message of a refused bulk action

#: The change form's edits that a user without the operate permission must not make to a cron job's task.
EDITS: dict[str, dict[str, str | None]] = {
    "pause": {"enabled": None},
    "kwargs": {"kwargs": '{"region": "us"}'},
    "active_from": {"start_time_0": "2026-12-01", "start_time_1": "00:00:00"},
    "active_until": {"expires_0": "2027-01-01", "expires_1": "00:00:00"},
    "one_off": {"one_off": "on"},
}


def region_report(run: Run, *, region: str = "eu") -> None:
    """The signature the gated job's parameters are read from (never run)."""


@pytest.fixture
def job(declare: Any) -> CronJob:
    """A cron job with a parameter, synced: its periodic task exists and drives it."""
    declare("gated", "GT1", schedule="0 3 * * *", timezone="UTC",
            parameters=params.from_signature(region_report, skip=1, job="gated"))
    schedule_sync.sync(T0)
    return CronJob.objects.get(name="gated")


@pytest.fixture
def plain() -> PeriodicTask:
    """A periodic task of django-celery-beat's own, on a crontab no cron job uses."""
    crontab = CrontabSchedule.objects.create(minute="5", hour="4", timezone="UTC")
    return PeriodicTask.objects.create(name="plain cleanup", task="tests.jobsapp.tasks.plain_ping", crontab=crontab)


def beat_editor(django_user_model: Any, *, operate: bool) -> Any:
    """A staff user with every django-celery-beat permission on periodic tasks and crontabs, who sees
    the jobs dashboard — and may operate cron jobs only when ``operate``."""
    name = "beat-operator" if operate else "beat-editor"
    user = django_user_model.objects.create_user(name, password="pw-not-used", is_staff=True)
    verbs, tables = ("view", "add", "change", "delete"), ("periodictask", "crontabschedule")
    beat = Q(content_type__app_label="django_celery_beat", codename__in=[f"{v}_{t}" for v in verbs for t in tables])
    ours = Q(content_type__app_label="cron_celery",
             codename__in=["view_cronjob"] + (["change_cronjob"] if operate else []))
    user.user_permissions.add(*Permission.objects.filter(beat | ours))
    return django_user_model.objects.get(id=user.id)  # permissions are cached per user object


def state(job: CronJob) -> tuple[Any, ...]:
    """What an edit of the job's periodic task would change, on the task and on the job's row."""
    task = PeriodicTask.objects.get(id=job.periodic_task_id)
    row = CronJob.objects.get(id=job.id)
    return (task.enabled, task.kwargs, task.start_time, task.expires, task.one_off, task.crontab_id, row.paused,
            row.params, row.active_from, row.active_until, row.one_off, row.schedule)


def as_user(client: Client, user: Any) -> Client:
    client.force_login(user)
    return client


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_without_the_operate_permission_a_cron_jobs_task_cannot_be_edited(admin_client, client, django_user_model,
                                                                         job, edit):
    page = f"{TASKS}{job.periodic_task_id}/change/"
    data = filled(admin_client, page, EDITS[edit])  # the form as an operator would send it
    before = state(job)
    refused = as_user(client, beat_editor(django_user_model, operate=False)).post(page, data)
    assert refused.status_code == 403
    assert state(job) == before


def test_without_the_operate_permission_a_cron_jobs_task_is_shown_read_only(client, django_user_model, job, plain):
    editor = as_user(client, beat_editor(django_user_model, operate=False))
    listing = editor.get(TASKS)
    assert listing.status_code == 200 and "gated (GT1)" in listing.content.decode()
    shown = editor.get(f"{TASKS}{job.periodic_task_id}/change/")
    html = shown.content.decode()
    assert shown.status_code == 200 and 'name="_save"' not in html and 'name="kwargs"' not in html
    assert "0 3 * * *" in html  # the schedule in effect, as the cron job's line says it
    own = editor.get(f"{TASKS}{plain.id}/change/").content.decode()
    assert 'name="_save"' in own and 'name="kwargs"' in own  # a plain task: django-celery-beat's permissions


def test_without_the_operate_permission_a_cron_jobs_task_cannot_be_deleted(client, django_user_model, job):
    editor = as_user(client, beat_editor(django_user_model, operate=False))
    assert editor.post(f"{TASKS}{job.periodic_task_id}/delete/", {"post": "yes"}).status_code == 403
    assert PeriodicTask.objects.filter(id=job.periodic_task_id).exists()
    assert CronJob.objects.get(id=job.id).periodic_task_id == job.periodic_task_id


@pytest.mark.parametrize("action", ["disable_tasks", "enable_tasks", "toggle_tasks", "run_tasks", "delete_selected"])
def test_without_the_operate_permission_no_bulk_action_touches_a_cron_jobs_task(client, django_user_model, job,
                                                                                 plain, queue, action):
    if action == "enable_tasks":  # something to enable
        PeriodicTask.objects.filter(id__in=[job.periodic_task_id, plain.id]).update(enabled=False)
    before, plain_before = state(job), PeriodicTask.objects.get(id=plain.id).enabled
    editor = as_user(client, beat_editor(django_user_model, operate=False))
    answer = editor.post(TASKS, {"action": action, "post": "yes", "_selected_action": [job.periodic_task_id, plain.id]},
                         follow=True)
    assert answer.status_code == 200 and REFUSED in answer.content.decode()
    assert state(job) == before
    # All or nothing: the plain task selected with it is left alone too, and no run was sent.
    assert PeriodicTask.objects.get(id=plain.id).enabled == plain_before
    assert queue.headers() == []


def test_a_plain_periodic_task_stays_with_django_celery_beats_permissions(admin_client, client, django_user_model,
                                                                          plain):
    editor = as_user(client, beat_editor(django_user_model, operate=False))
    page = f"{TASKS}{plain.id}/change/"
    assert editor.post(page, filled(admin_client, page, {"enabled": None, "kwargs": '{"x": 1}'})).status_code == 302
    changed = PeriodicTask.objects.get(id=plain.id)
    assert (changed.enabled, changed.kwargs) == (False, '{"x": 1}')
    editor.post(TASKS, {"action": "enable_tasks", "_selected_action": [plain.id]})
    assert PeriodicTask.objects.get(id=plain.id).enabled


def test_with_the_operate_permission_a_cron_jobs_task_is_edited_and_acted_on(admin_client, client, django_user_model,
                                                                             job):
    operator = as_user(client, beat_editor(django_user_model, operate=True))
    page = f"{TASKS}{job.periodic_task_id}/change/"
    changes = {key: value for edit in EDITS.values() for key, value in edit.items()}
    saved = operator.post(page, filled(admin_client, page, changes))
    assert saved.status_code == 302, saved.content.decode()[:2000]
    task = PeriodicTask.objects.get(id=job.periodic_task_id)
    assert (task.enabled, task.kwargs, task.one_off) == (False, '{"region": "us"}', True)
    assert task.start_time is not None and task.expires is not None
    assert CronJob.objects.get(id=job.id).paused  # the trigger followed the task
    operator.post(TASKS, {"action": "enable_tasks", "_selected_action": [job.periodic_task_id]})
    assert PeriodicTask.objects.get(id=job.periodic_task_id).enabled
    assert not CronJob.objects.get(id=job.id).paused


def test_a_crontab_that_drives_a_cron_job_is_edited_in_place_only_with_the_operate_permission(
        admin_client, client, django_user_model, job, plain):
    crontab = PeriodicTask.objects.get(id=job.periodic_task_id).crontab
    assert crontab is not None
    page = f"{CRONTABS}{crontab.id}/change/"
    data = filled(admin_client, page, {"minute": "30"})
    editor = as_user(client, beat_editor(django_user_model, operate=False))
    assert editor.post(page, data).status_code == 403
    assert editor.post(f"{CRONTABS}{crontab.id}/delete/", {"post": "yes"}).status_code == 403
    assert CrontabSchedule.objects.get(id=crontab.id).minute == "0"
    assert CronJob.objects.get(id=job.id).schedule == "0 3 * * *"
    own = f"{CRONTABS}{plain.crontab_id}/change/"  # a crontab no cron job uses: django-celery-beat's permissions
    assert editor.post(own, filled(admin_client, own, {"minute": "45"})).status_code == 302
    assert CrontabSchedule.objects.get(id=plain.crontab_id).minute == "45"
    operator = as_user(Client(), beat_editor(django_user_model, operate=True))
    assert operator.post(page, data).status_code == 302
    assert CrontabSchedule.objects.get(id=crontab.id).minute == "30"

