# A job's limit on live runs at once, decided in the claim: 1 for overlap-skip (and rate-limited)
# jobs, max_concurrency for overlap-allow jobs that declare one, none otherwise. Existing
# exclusive jobs get their 1 now; every declaration writes its own value at the next start.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0013_rollups'),
    ]

    operations = [
        migrations.AddField(
            model_name='cronjob',
            name='max_concurrency',
            field=models.IntegerField(blank=True, help_text="Live runs allowed at once (1 for overlap 'skip'); empty = any number. Declared in code", null=True),
        ),
        migrations.RunSQL(
            "UPDATE cron_celery_cronjob SET max_concurrency = 1 WHERE overlap = 'skip' OR pattern = 'rate_limited'",
            migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name='cronexecution',
            name='skip_reason',
            field=models.CharField(blank=True, choices=[('ALREADY_RAN', 'Slot already ran'), ('ALREADY_RUNNING', 'Slot is running'), ('OVERLAP', 'Job already running'), ('PAUSED', 'Job paused'), ('LOCK_UNAVAILABLE', 'Lock unavailable'), ('CONCURRENCY', 'Concurrency limit')], max_length=20),
        ),
    ]
