"""A Django app of two migrations on cron_celery's busy tables, for tests/test_migration_rules.py: one
that keeps the lock_timeout rule (docs/migrating.md) and one that breaks it in every way the check
looks for. Installed only where a test asks for it (CRON_TEST_MIGRATION_EXAMPLE=1, tests/settings.py):
the suite's own databases never carry its column or its index."""
