"""Django signals sent after each outcome (``execution_failed``, ``execution_succeeded``, ...).

The public path of ``cron_celery.alerts.signals``, kept where the documentation and your code import it; the
package itself imports the module in its room."""

from cron_celery.alerts.signals import *  # noqa: F403
