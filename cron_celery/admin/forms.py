"""The forms of the jobs dashboard's actions: a date range to backfill, a one-off run's time, a
run's parameters (one field per declared parameter, typed)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django import forms
from django.utils.html import format_html

from cron_celery.decisions import pauses
from cron_celery.declaring import params, registry


class BackfillForm(forms.Form):
    start = forms.DateField(label="From", help_text="First date, in the job's timezone")
    end = forms.DateField(label="To", help_text="Last date (inclusive)")
    force = forms.BooleanField(required=False, label="Also slots that already ran")
    cascade = forms.BooleanField(required=False, label="Cascade: also run the jobs that run after it",
                                 help_text="Each slot that succeeds runs that slot of its downstream jobs "
                                           "(declared with after=) again")


class OneOffForm(forms.Form):
    at = forms.CharField(label="At", help_text="e.g. 2026-12-01 18:00, in each job's timezone unless you add an "
                                               "offset or Z; must be in the future")
    force = forms.BooleanField(required=False, label="Run even if the job is paused then")


class PauseForm(forms.Form):
    note = forms.CharField(label="Note", required=False, max_length=pauses.NOTE_MAX,
                           widget=forms.Textarea(attrs={"rows": 3}),
                           help_text="Why (shown on the dashboard, the job's page, the API and the audit log)")
    until = forms.CharField(label="Until", required=False, max_length=64,
                            help_text="Optional: when the job resumes itself, e.g. 2026-12-08 08:00, in each "
                                      "job's timezone unless you add an offset or Z; must be in the future. "
                                      "Empty: until somebody resumes it")


def _param_field(param: params.Param, initial: params.Json, scheduled: bool) -> forms.Field:
    """The form field of one parameter, by its kind; empty means None (optional), the default, or ''."""
    said = f"{param.type_text}; " + ("required" if param.required else f"default {json.dumps(param.default_json)}")
    said += f"; its scheduled value (the periodic task's kwargs) is {json.dumps(initial)}" if scheduled else ""
    if param.kind == params.DATETIME:
        said += " (e.g. 2026-12-01 18:00, in the job's timezone unless you add an offset or Z)"
    # A form's help text is not escaped by Django: the values in it (kwargs typed in the admin) are, here.
    options: dict[str, Any] = {"label": param.name, "help_text": format_html("{}", said), "initial": initial,
                               "required": param.required and not param.optional and param.kind != params.BOOL}
    if param.kind == params.BOOL:
        return forms.NullBooleanField(**{**options, "required": False}) if param.optional else \
            forms.BooleanField(**{**options, "required": False})
    if param.kind == params.INT:
        return forms.IntegerField(**options)
    if param.kind == params.FLOAT:
        return forms.FloatField(**options)
    if param.kind == params.DATE:
        return forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), **options)
    if param.kind == params.CHOICE:
        choices = [(spelled(choice), spelled(choice)) for choice in param.choices]
        return forms.ChoiceField(choices=([("", "— (None)")] if param.optional else []) + choices,
                                 **{**options, "initial": spelled(initial) if initial is not None else ""})
    return forms.CharField(strip=False, **options)


def spelled(value: object) -> str:
    """A parameter's value as a person types it: ``us``, ``true``, ``2026-12-01``; None as ``null``."""
    return value if isinstance(value, str) else json.dumps(value)


class ParamsForm(forms.Form):
    """"Run with parameters…": a field per parameter of the job, from its signature (initial: its
    scheduled value, else its default), the slot's date, and whether to run while paused. ``values``
    (once valid) are the checked values, as stored."""

    PREFIX = "param_"

    def __init__(self, job: registry.Job, scheduled: Mapping[str, Any] | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job = job
        self.values: dict[str, params.Json] = {}
        for param in job.parameters:
            given = scheduled is not None and param.name in scheduled
            initial = scheduled[param.name] if scheduled is not None and given else param.default_json
            self.fields[self.PREFIX + param.name] = _param_field(param, initial, given)
        self.fields["date"] = forms.DateField(
            required=False, label="Execution date", widget=forms.DateInput(attrs={"type": "date"}),
            help_text="The slot it runs for: the job's first slot that day; empty: the current minute")
        self.fields["force"] = forms.BooleanField(required=False, label="Run even if the job is paused")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for param in self.job.parameters:
            key = self.PREFIX + param.name
            if key not in data:  # its field already has its error
                continue
            value = data[key]
            if value in (None, "") and param.kind != params.BOOL:
                value = None if param.optional else "" if param.kind == params.STR else \
                    None if param.required else param.default
            elif param.kind == params.CHOICE:
                value = params.parse_text(param, str(value), self.job.tzinfo)
            try:
                self.values[param.name] = params.to_json(param, value, self.job.tzinfo)
            except ValueError as error:
                self.add_error(key, f"{error}.")
        return data
