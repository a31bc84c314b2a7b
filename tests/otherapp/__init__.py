"""A Django app of someone else's, as a team adopting cron_celery has them: its Celery tasks know
nothing of cron_celery (a custom base class with its own ``__call__``, ``bind=True``, a class-based
task, an async function run through ``async_to_sync``). Its periodic tasks are tracked all the same
(tests/faults/test_tracking_many.py)."""
