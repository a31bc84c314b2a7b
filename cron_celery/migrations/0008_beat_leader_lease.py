# The beat leader's lease row in PostgreSQL (used when no Redis quorum answers), and the
# reconciler pass's (a lease row, not a session advisory lock, so it works behind poolers).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_celery', '0007_operations'),
    ]

    operations = [
        migrations.CreateModel(
            name='Lease',
            fields=[
                ('name', models.CharField(max_length=50, primary_key=True, serialize=False)),
                ('holder', models.CharField(help_text='host:pid', max_length=200)),
                ('token', models.CharField(max_length=64)),
                ('lease_until', models.DateTimeField()),
                ('since', models.DateTimeField(help_text='When this holder took it')),
            ],
            options={
                'ordering': ['name'],
            },
        ),
    ]
