# Operations: beat heartbeats for the health endpoint, and the fenced-outcome counter.

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0006_drop_open_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='BeatHeartbeat',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('identity', models.CharField(help_text='host:pid', max_length=200, unique=True)),
                ('leading', models.BooleanField(default=False)),
                ('started_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('seen_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'ordering': ['-seen_at'],
            },
        ),
        migrations.AddField(
            model_name='cronjob',
            name='fenced_count',
            field=models.IntegerField(db_default=0, help_text='Outcomes not recorded because another worker had taken the run over'),
        ),
    ]
