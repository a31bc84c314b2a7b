# A third overlap policy, buffer_one (declared in code): as skip, but one regular slot waits for the live run.
# The choices are Django's only: nothing in the database changes, and no table is locked.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("cron_celery", "0006_pause_note")]

    operations = [
        migrations.AlterField(
            model_name="cronjob", name="overlap",
            field=models.CharField(choices=[("skip", "Skip"), ("allow", "Allow"), ("buffer_one", "Buffer one")],
                                   max_length=10),
        ),
    ]
