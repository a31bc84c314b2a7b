"""A django-tenants project with tenant-schemas-celery (one PostgreSQL schema per customer), whose
periodic tasks are tracked: tests/faults/test_tenant_tasks.py runs its beat and workers."""
