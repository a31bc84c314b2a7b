from django.apps import AppConfig


class MigrationExampleConfig(AppConfig):
    name = "tests.migration_example"
    label = "cron_celery_example"
