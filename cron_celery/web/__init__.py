"""The endpoints and pages: status, health, metrics, run and audit views with their tokens, the
dashboard's figures and the next hour of slots. The admin is its own room (``cron_celery.admin``)."""
