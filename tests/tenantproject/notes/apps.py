from django.apps import AppConfig


class NotesConfig(AppConfig):
    name = "tests.tenantproject.notes"
    label = "notes"
    default_auto_field = "django.db.models.BigAutoField"
