"""The audit log of schedule changes: who makes a transaction's changes (``set_author``) and reading its rows.

The public path of ``cron_celery.decisions.audit``, kept where the documentation and your code import it; the
package itself imports the module in its room."""

from cron_celery.decisions.audit import *  # noqa: F403
