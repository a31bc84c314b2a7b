# Why an admin edit of a job's schedule could not be applied.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0008_beat_leader_lease'),
    ]

    operations = [
        migrations.AddField(
            model_name='cronjob',
            name='schedule_problem',
            field=models.TextField(
                blank=True, db_default='',
                help_text="Why the periodic task's schedule cannot drive the job (the job keeps its previous one); "
                          "empty when it is in effect",
            ),
        ),
    ]
