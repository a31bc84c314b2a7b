"""Listening to every run's start and end (Listener, subscribe, failures).

The public path of ``cron_celery.run.events``, kept where the documentation and your code import it; the
package itself imports the module in its room."""

from cron_celery.run.events import *  # noqa: F403
