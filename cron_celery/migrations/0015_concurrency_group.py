# The concurrency group a job counts against (CONCURRENCY_GROUPS in settings): written from the
# job's declaration at every start, like max_concurrency (0014). Empty for every existing job.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0014_concurrency'),
    ]

    operations = [
        migrations.AddField(
            model_name='cronjob',
            name='concurrency_group',
            field=models.CharField(blank=True, db_default='', help_text='The shared limit this job counts against (CONCURRENCY_GROUPS); empty = none. Declared in code', max_length=100),
        ),
    ]
