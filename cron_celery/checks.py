"""Django system checks with stable ids (``cron_celery.E001`` ...), run at start-up.

Management commands stop on an error as usual. Celery's Django fixup runs the checks too but
ignores what they find, so workers (``connect()``) and beats (``beat.Scheduler``) refuse to
start on an error of ours: a worker whose lock outlives its lease, or a beat with a broken reconciler setting,
would otherwise run and quietly break the guarantees. ``SILENCED_SYSTEM_CHECKS`` still
silences an id, as it does for Django. A web process cannot refuse to start from here: it
runs the checks once (``process_errors``), and its health endpoint answers 503 and the admin
dashboard shows a banner while they find an error.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core import checks

from cron_celery import check_errors, conf, enums, spelling
from cron_celery.web import tokens

TAG = check_errors.TAG

logger = logging.getLogger(__name__)


def connect() -> None:
    from celery import signals

    # The beat's check is in cron_celery.beat.Scheduler.__init__: Celery builds the scheduler,
    # which syncs the schedules, before it sends beat_init.
    signals.worker_init.connect(_worker_init, weak=False, dispatch_uid="cron_celery.checks.worker")


def _worker_init(**_kwargs: Any) -> None:
    check_errors.refuse_to_start("worker")


def register() -> None:
    checks.register(check_settings, TAG)
    checks.register(check_connection_reuse, TAG)
    checks.register(check_lock, TAG)
    checks.register(check_timing, TAG)
    checks.register(check_notifications, TAG)
    checks.register(check_operations, TAG)
    checks.register(check_tokens, TAG)
    checks.register(check_groups, TAG)
    checks.register(check_dependencies, TAG)


#: The documentation's pages a hint sends the reader to, by file name, with their titles.
PAGES = {"configuration": "Configuration", "notifications": "Notifications", "operations": "Operations",
         "concepts": "Concepts"}


def see(page: str, anchor: str = "") -> str:
    """Where a hint sends the reader: a page of the documentation by its title and file, which a
    project that installed the wheel finds in cron_celery's source distribution (docs/) or the site."""
    return (f"See “{PAGES[page]}” in cron_celery's documentation: docs/{page}.md{'#' + anchor if anchor else ''} "
            "(in the source distribution and the repository, or the site built from them).")


def _first_up(text: str) -> str:
    return text[:1].upper() + text[1:]


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for key in conf.unknown_keys():
        errors.append(checks.Error(
            f"CRON_CELERY has an unknown key {key!r}.",
            hint=f"{_first_up(spelling.suggestion(key, conf.FIELDS))}Known keys: {', '.join(sorted(conf.FIELDS))}. "
                 + see("configuration"),
            id="cron_celery.E001",
        ))
    try:
        values = conf.load()
    except TypeError as exc:
        return [*errors, checks.Error(f"CRON_CELERY cannot be read: {exc}", id="cron_celery.E002")]
    minimums = {"LEASE_SECONDS": 3, "BEAT_LEASE_SECONDS": 3, "BEAT_BATCH": 1, "CATCH_UP_LIMIT": 1,
                "MESSAGE_MAX_CHARS": 100, "TRACEBACK_MAX_CHARS": 100, "RESULT_MAX_CHARS": 100}
    for key, minimum in minimums.items():
        value = getattr(values, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            errors.append(checks.Error(
                f"CRON_CELERY[{key!r}] must be an integer of at least {minimum}, not {value!r}.",
                id="cron_celery.E002",
            ))

    for key, enum in (("DEFAULT_PATTERN", enums.ExecutionPattern),
                      ("DEFAULT_OVERLAP", enums.Overlap)):
        value = getattr(values, key)
        if str(value).lower() not in {m.value for m in enum} | {m.name.lower() for m in enum}:
            errors.append(checks.Error(
                f"CRON_CELERY[{key!r}] is {value!r}; use one of "
                f"{', '.join(m.value for m in enum)}.",
                id="cron_celery.E003",
            ))
    if values.DEFAULT_TIMEZONE is not None:
        import zoneinfo

        try:
            zoneinfo.ZoneInfo(values.DEFAULT_TIMEZONE)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            errors.append(checks.Error(
                f"CRON_CELERY['DEFAULT_TIMEZONE'] {values.DEFAULT_TIMEZONE!r} is not a timezone.",
                hint="Use an IANA name such as 'Europe/Amsterdam'.",
                id="cron_celery.E004",
            ))
    return [*errors, *_tracking_problems(values)]


def _tracking_problems(values: conf.Settings) -> list[checks.CheckMessage]:
    """E017: ``TRACK_PERIODIC_TASKS`` or ``TRACKED_CATCH_UP`` that cannot be read (nothing is tracked then)."""
    from cron_celery.tracking import selection

    errors: list[checks.CheckMessage] = []
    problem = selection.problem(values.TRACK_PERIODIC_TASKS)
    if problem:
        errors.append(checks.Error(f"CRON_CELERY['TRACK_PERIODIC_TASKS']: {problem}.",
                                   hint=see("configuration", "tracking-periodic-tasks"), id="cron_celery.E017"))
    if str(values.TRACKED_CATCH_UP) not in {policy.value for policy in enums.CatchUp}:
        errors.append(checks.Error(f"CRON_CELERY['TRACKED_CATCH_UP'] is {values.TRACKED_CATCH_UP!r}; use one of "
                                   f"{', '.join(policy.value for policy in enums.CatchUp)}.",
                                   hint=see("configuration", "tracking-periodic-tasks"), id="cron_celery.E017"))
    return errors


def check_connection_reuse(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if conf.celery_db_reuse_max():
        return []
    return [checks.Warning(
        "CELERY_DB_REUSE_MAX is not set: Celery closes the database connection before and "
        "after every task, so each tracked run opens a new PostgreSQL connection.",
        hint="Set CELERY_DB_REUSE_MAX = 1000. " + see("configuration", "celery-and-database-settings-that-matter"),
        id="cron_celery.W001",
    )]


def check_lock(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Redlock needs 1 or at least 3 independent masters, and a TTL within the lease."""
    try:
        values = conf.load()
    except TypeError:
        return []  # reported by check_settings
    lock = values.LOCK
    errors: list[checks.CheckMessage] = []
    if not isinstance(lock, dict):
        return [checks.Error("CRON_CELERY['LOCK'] must be a dict with MASTERS, TTL and PREFIX.",
                             id="cron_celery.E005")]
    unknown = sorted(set(lock) - set(conf.LOCK_DEFAULTS))
    if unknown:
        errors.append(checks.Error(f"CRON_CELERY['LOCK'] has unknown keys {unknown}; use MASTERS, TTL and PREFIX.",
                                   id="cron_celery.E005"))
    prefix = lock.get("PREFIX")
    if prefix is not None and (not isinstance(prefix, str) or not prefix.strip()):
        errors.append(checks.Error(f"CRON_CELERY['LOCK']['PREFIX'] must be a non-empty string or None, not {prefix!r}.",
                                   id="cron_celery.E005"))
    masters = lock.get("MASTERS")
    if masters is not None:
        if isinstance(masters, str) or not all(
            isinstance(url, str) and url.startswith(("redis://", "rediss://", "unix://")) for url in masters
        ):
            errors.append(checks.Error(
                "CRON_CELERY['LOCK']['MASTERS'] must be a list of Redis URLs (redis://host:port/db).",
                id="cron_celery.E005"))
        elif len(masters) == 2:
            errors.append(checks.Error(
                "CRON_CELERY['LOCK']['MASTERS'] lists 2 Redis masters: a Redlock quorum of 2 out of 2 "
                "stops as soon as either is down, so 2 is less available than 1.",
                hint="Use 1 master, or 3 or more independent ones (an odd number).",
                id="cron_celery.E006"))
    ttl = lock.get("TTL")
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl < 1:
        errors.append(checks.Error(f"CRON_CELERY['LOCK']['TTL'] must be a number of seconds >= 1, not {ttl!r}.",
                                   id="cron_celery.E007"))
    elif isinstance(values.LEASE_SECONDS, int) and ttl > values.LEASE_SECONDS:
        errors.append(checks.Error(
            f"CRON_CELERY['LOCK']['TTL'] ({ttl} s) is longer than LEASE_SECONDS ({values.LEASE_SECONDS} s): "
            "a crashed worker's lock would outlive its database lease.",
            hint="Keep the lock TTL at or below the lease; both are renewed every third of it.",
            id="cron_celery.E007"))
    return errors


def check_timing(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The timing rules of docs/reliability.md: the reconciler's settings, and each job's
    time limits and retry waits against the broker's visibility timeout."""
    try:
        values = conf.load()
    except TypeError:
        return []  # reported by check_settings
    errors: list[checks.CheckMessage] = []
    for key, minimum in (("DEFAULT_MAX_RETRIES", 0),):
        value = getattr(values, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            errors.append(checks.Error(f"CRON_CELERY[{key!r}] must be an integer of at least {minimum}, not {value!r}.",
                                       id="cron_celery.E002"))
    from cron_celery.declaring import options

    deadline = values.DEFAULT_START_DEADLINE
    if deadline is not None and not options.valid_bound(deadline):
        errors.append(checks.Error(f"CRON_CELERY['DEFAULT_START_DEADLINE'] must be a number of seconds above 0 and at "
                                   f"most {options.LONGEST_BOUND:.0e}, or None, not {deadline!r}.",
                                   id="cron_celery.E002"))
    for key in ("DEFAULT_SOFT_TIME_LIMIT", "DEFAULT_TIME_LIMIT"):
        value = getattr(values, key)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or value <= 0):
            errors.append(checks.Error(f"CRON_CELERY[{key!r}] must be a number of seconds above 0 or None, "
                                       f"not {value!r}.", id="cron_celery.E002"))
    jitter = values.DEFAULT_JITTER
    if not isinstance(jitter, int | float) or isinstance(jitter, bool) or not 0 <= jitter < math.inf:
        errors.append(checks.Error(f"CRON_CELERY['DEFAULT_JITTER'] must be a number of seconds of at least 0, "
                                   f"not {jitter!r}.", id="cron_celery.E002"))
    errors += _check_reconcile(values.RECONCILE)
    errors += _check_jobs()
    return errors


def _check_reconcile(options: object) -> list[checks.CheckMessage]:
    if not isinstance(options, dict):
        return [checks.Error("CRON_CELERY['RECONCILE'] must be a dict.", id="cron_celery.E008")]
    errors: list[checks.CheckMessage] = []
    unknown = sorted(set(options) - set(conf.RECONCILE_DEFAULTS))
    if unknown:
        errors.append(checks.Error(
            f"CRON_CELERY['RECONCILE'] has unknown keys {unknown}; use {', '.join(conf.RECONCILE_DEFAULTS)}.",
            id="cron_celery.E008"))
    rules = {"INTERVAL": (0, False), "PENDING_GRACE": (0, True), "MISSED_GRACE": (0, True),
             "REPUBLISH_LIMIT": (0, False), "BATCH": (1, False)}
    for key, (minimum, strict) in rules.items():
        value = options.get(key)
        good = isinstance(value, int | float) and not isinstance(value, bool) and (
            value > minimum if strict else value >= minimum)
        if key in ("REPUBLISH_LIMIT", "BATCH"):
            good = good and isinstance(value, int)
        if not good:
            relation = "above" if strict else "at least"
            errors.append(checks.Error(f"CRON_CELERY['RECONCILE'][{key!r}] must be a number {relation} {minimum}, "
                                       f"not {value!r}.", id="cron_celery.E008"))
    return errors


def _check_jobs() -> list[checks.CheckMessage]:
    """Against a broker that redelivers unacknowledged messages (Redis, SQS): a job still
    running at ``visibility_timeout`` would have its message delivered again, and an ETA
    message (a retry's countdown) held longer than half of it may be delivered twice."""
    visibility = conf.celery_visibility_timeout()
    if visibility is None:
        return []
    from cron_celery.declaring import registry
    from cron_celery.run import retries

    errors: list[checks.CheckMessage] = []
    for job in registry.all_jobs():
        if job.time_limit is not None and job.time_limit >= visibility:
            errors.append(checks.Error(
                f"Job {job.name!r}: time_limit ({job.time_limit:g} s) must be shorter than the broker's "
                f"visibility_timeout ({visibility:g} s), or the message is delivered again while the job runs.",
                hint="Lower time_limit, or raise CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout'].",
                id="cron_celery.E009"))
        if job.max_retries:
            longest = retries.FIXED_DELAY if job.retry_backoff is False else float(job.retry_backoff_max)
            if longest >= visibility / 2:
                errors.append(checks.Error(
                    f"Job {job.name!r}: a retry may wait {longest:g} s, which is not below half the broker's "
                    f"visibility_timeout ({visibility:g} s / 2); a waiting retry would be delivered twice.",
                    hint="Lower retry_backoff_max, or raise the visibility_timeout.",
                    id="cron_celery.E010"))
    return errors


def check_notifications(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Unknown channels and channels without their credentials (E011); a bad ADMIN_BASE_URL (E012)."""
    try:
        values = conf.load()
    except TypeError:
        return []
    if not isinstance(values.NOTIFICATIONS, dict):
        return [checks.Error("CRON_CELERY['NOTIFICATIONS'] must be a dict.", id="cron_celery.E011")]
    from cron_celery.alerts import channels

    errors: list[checks.CheckMessage] = [
        checks.Error(problem, hint=see("notifications"), id="cron_celery.E011") for problem in channels.problems()
    ]
    for key in ("timeout", "max_attempts"):
        value = values.NOTIFICATIONS.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            errors.append(checks.Error(
                f"CRON_CELERY['NOTIFICATIONS'][{key!r}] must be a number above 0, not {value!r}.",
                id="cron_celery.E011"))
    base = values.ADMIN_BASE_URL
    if base and not (isinstance(base, str) and base.startswith(("http://", "https://"))):
        errors.append(checks.Error(f"CRON_CELERY['ADMIN_BASE_URL'] must start with http:// or https://, not {base!r}.",
                                   id="cron_celery.E012"))
    return errors


def check_operations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """API_TOKEN, HEALTH and retention settings (E013)."""
    try:
        values = conf.load()
    except TypeError:
        return []
    errors: list[checks.CheckMessage] = []

    def error(text: str) -> None:
        errors.append(checks.Error(text, hint=see("operations"), id="cron_celery.E013"))

    if not isinstance(values.API_TOKEN, str):
        error(f"CRON_CELERY['API_TOKEN'] must be a string, not {type(values.API_TOKEN).__name__}.")
    elif values.API_TOKEN and len(values.API_TOKEN) < 16:
        error("CRON_CELERY['API_TOKEN'] is shorter than 16 characters: use a long random string.")
    health = values.HEALTH
    if not isinstance(health, dict) or set(health) - set(conf.HEALTH_DEFAULTS):
        error(f"CRON_CELERY['HEALTH'] takes {', '.join(conf.HEALTH_DEFAULTS)}.")
    else:
        for key in conf.HEALTH_DEFAULTS:
            value = health.get(key)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                error(f"CRON_CELERY['HEALTH'][{key!r}] must be a number of seconds above 0, not {value!r}.")
    for key in ("RETENTION_DAYS", "ALERT_RETENTION_DAYS", "AUDIT_RETENTION_DAYS"):
        days = getattr(values, key)
        if days is not None and (not isinstance(days, int) or isinstance(days, bool) or days < 1):
            error(f"CRON_CELERY[{key!r}] must be a whole number of days (1 or more) or None, not {days!r}.")
    from cron_celery.reconciler import retention

    try:
        retention.statuses(list(values.RETENTION_STATUSES))
    except (ValueError, TypeError) as problem:
        error(f"CRON_CELERY['RETENTION_STATUSES']: {problem}.")
    return errors


def check_tokens(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """API_TOKENS (E014: short, duplicated, unknown scopes...) and the deprecated API_TOKEN (W002).
    No message ever contains a token's value."""
    try:
        values = conf.load()
    except TypeError:
        return []
    parsed = tokens.parse(values)
    found: list[checks.CheckMessage] = [
        checks.Error(problem, hint=see("operations", "tokens"), id="cron_celery.E014")
        for problem in parsed.problems
    ]
    if parsed.legacy:
        found.append(checks.Warning(tokens.DEPRECATION, id="cron_celery.W002"))
    return found


def check_groups(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """CONCURRENCY_GROUPS and the jobs' concurrency groups (E015: a bad limit, a job whose group is
    not configured — its runs would have no shared limit)."""
    try:
        conf.load()
    except TypeError:
        return []
    from cron_celery.decisions import groups
    from cron_celery.declaring import registry

    return [checks.Error(problem, hint=see("configuration", "concurrency_groups"), id="cron_celery.E015")
            for problem in groups.problems(registry.all_jobs())]


def check_dependencies(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The jobs declared with ``after=`` (E016: an upstream that is not declared, upstreams that do
    not share one schedule — the downstream's slots would never, or only sometimes, come)."""
    from cron_celery.decisions import dependencies
    from cron_celery.declaring import registry

    return [checks.Error(problem, hint=see("concepts", "dependencies-after"), id="cron_celery.E016")
            for problem in dependencies.problems(registry.all_jobs())]
