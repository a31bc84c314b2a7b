from django.db import models


class Note(models.Model):
    """One call of the task's body: the schema it ran in, as its connection said, and the slot's
    execution the message named."""

    text = models.CharField(max_length=100)
    schema = models.CharField(max_length=63)
    execution_id = models.BigIntegerField(null=True)
    written_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.schema}: {self.text}"
