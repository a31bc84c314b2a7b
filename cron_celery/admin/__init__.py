"""The admin: a jobs dashboard, the execution history, the alerts outbox, the audit log of schedule
changes, and django-celery-beat's admins told who edits. One module per page (its actions beside it).

History is an audit trail: no form edits an execution. Actions go through the same code paths as the
commands (``tasks.send_run``, ``backfill``, ``outcomes``), so an action in the admin is recorded like
any other run. Django finds this package as ``cron_celery.admin``: importing it registers every page.
"""

from cron_celery.admin import alerts, executions, jobs, periodic_tasks, schedule_changes
from cron_celery.admin.periodic_tasks import Audited

__all__ = ["Audited", "alerts", "executions", "jobs", "periodic_tasks", "schedule_changes"]
