# cron_celery's tables as of its first release: the models' state, then the functions and triggers the
# models do not say (cron_celery/migrations/_initial: beat sync, counting, dependencies, audit).
#
# It folds the 26 migrations written before the first release, which no database outside this repository
# held: the schema it makes is the one they made, checked table by table, index by index, function by
# function when they were folded. From here on every migration follows docs/migrating.md.

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

from cron_celery.migrations._initial import after, audit, beat_sync, counting


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('django_celery_beat', '0018_improve_crontab_helptext'),
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
        migrations.CreateModel(
            name='CronJob',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.SlugField(max_length=100, unique=True)),
                ('code', models.CharField(max_length=50, unique=True)),
                ('task', models.CharField(help_text='Celery task name', max_length=200)),
                ('pattern', models.CharField(choices=[('standard', 'Standard'), ('rerun_on_failure', 'Rerun on failure'), ('always', 'Always'), ('rate_limited', 'Rate limited')], max_length=20)),
                ('overlap', models.CharField(choices=[('skip', 'Skip'), ('allow', 'Allow')], max_length=10)),
                ('timezone', models.CharField(default='UTC', max_length=64)),
                ('description', models.TextField(blank=True)),
                ('paused', models.BooleanField(default=False)),
                ('catch_up', models.CharField(choices=[('none', 'None'), ('latest', 'Latest'), ('all', 'All')], default='latest', max_length=10)),
                ('next_run_at', models.DateTimeField(blank=True, db_index=True, help_text='The first slot not dispatched yet (UTC)', null=True)),
                ('schedule', models.CharField(blank=True, db_default='', help_text="Five-field cron, or 'every Ns' for an interval", max_length=200)),
                ('schedule_timezone', models.CharField(blank=True, db_default='', max_length=64)),
                ('schedule_problem', models.TextField(blank=True, db_default='', help_text="Why the periodic task's schedule cannot drive the job (the job keeps its previous one); empty when it is in effect")),
                ('declaration_hash', models.CharField(blank=True, db_default='', help_text="The code's schedule at the last sync", max_length=64)),
                ('schedule_version', models.BigIntegerField(db_default=0)),
                ('schedule_seen', models.BigIntegerField(db_default=0)),
                ('fence', models.BigIntegerField(default=0, help_text='Grows with every claim of this job')),
                ('max_retries', models.IntegerField(db_default=0, help_text='Attempts after the first one; enforced here, not only in the message')),
                ('alert_after', models.IntegerField(db_default=1, help_text='Consecutive failures before the first alert')),
                ('max_concurrency', models.IntegerField(blank=True, help_text="Live runs allowed at once (1 for overlap 'skip'); empty = any number. Declared in code", null=True)),
                ('concurrency_group', models.CharField(blank=True, db_default='', help_text='The shared limit this job counts against (CONCURRENCY_GROUPS); empty = none. Declared in code', max_length=100)),
                ('jitter_ms', models.IntegerField(db_default=0, help_text='Each slot is sent this many milliseconds after it (its jitter). Declared in code')),
                ('due_at', models.DateTimeField(blank=True, db_index=True, editable=False, help_text='When the next slot is sent: next_run_at + jitter (UTC)', null=True)),
                ('active_from', models.DateTimeField(blank=True, help_text='No slot before this is dispatched or recorded (UTC); empty = no start', null=True)),
                ('active_until', models.DateTimeField(blank=True, help_text='No slot at or after this is dispatched or recorded (UTC); empty = no end', null=True)),
                ('one_off', models.BooleanField(db_default=False, help_text="The periodic task's one_off: after one slot is sent, the job is paused")),
                ('removed_at', models.DateTimeField(blank=True, help_text='When a deploy found it no longer declared in the code (its edges and waiting runs were retired then); empty = declared', null=True)),
                ('alert_repeat', models.IntegerField(blank=True, help_text='Seconds between repeated alerts of one incident; empty = once', null=True)),
                ('start_deadline', models.FloatField(blank=True, help_text='Seconds after it was due by which a run must have started, else one LATE alert; empty = no deadline. Declared in code', null=True)),
                ('max_runtime', models.FloatField(blank=True, help_text='Seconds a run may take before one LONG_RUNNING alert (it is not stopped); empty = no bound. Declared in code', null=True)),
                ('min_runtime', models.FloatField(blank=True, help_text='A success faster than this many seconds alerts TOO_FAST; empty = no bound. Declared in code', null=True)),
                ('params', models.JSONField(blank=True, help_text="The parameter values of its scheduled runs: the periodic task's kwargs, checked (a refused edit leaves the previous ones); empty = none", null=True)),
                ('alerted_at', models.DateTimeField(blank=True, help_text='When the open incident was last alerted; empty = no alerted incident', null=True)),
                ('consecutive_failures', models.IntegerField(default=0)),
                ('too_fast_in_a_row', models.IntegerField(db_default=0, help_text='Successes in a row faster than min_runtime (a failure leaves the count alone)')),
                ('too_fast_alerted_at', models.DateTimeField(blank=True, help_text='When the open too-fast incident was last alerted; empty = none alerted', null=True)),
                ('fenced_count', models.IntegerField(db_default=0, help_text='Outcomes not recorded because another worker had taken the run over')),
                ('last_status', models.CharField(blank=True, choices=[('PENDING', 'Pending'), ('RUNNING', 'Running'), ('RETRYING', 'Retrying'), ('SUCCEEDED', 'Succeeded'), ('FAILED', 'Failed'), ('TIMED_OUT', 'Timed out'), ('LOST', 'Lost'), ('SKIPPED', 'Skipped'), ('MISSED', 'Missed'), ('REVOKED', 'Revoked')], max_length=20)),
                ('last_run_at', models.DateTimeField(blank=True, null=True)),
                ('last_success_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('periodic_task', models.OneToOneField(blank=True, help_text='Where the schedule is edited in the admin', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='cron_job', to='django_celery_beat.periodictask')),
            ],
            options={
                'verbose_name': 'cron job',
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='CronExecution',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('task_code', models.CharField(max_length=50)),
                ('task_name', models.CharField(max_length=100)),
                ('slot', models.DateTimeField(help_text='The scheduled instant, stored in UTC')),
                ('execution_date', models.DateField(help_text="The slot's local date in the job's timezone")),
                ('run_number', models.PositiveIntegerField(default=1)),
                ('status', models.CharField(choices=[('PENDING', 'Pending'), ('RUNNING', 'Running'), ('RETRYING', 'Retrying'), ('SUCCEEDED', 'Succeeded'), ('FAILED', 'Failed'), ('TIMED_OUT', 'Timed out'), ('LOST', 'Lost'), ('SKIPPED', 'Skipped'), ('MISSED', 'Missed'), ('REVOKED', 'Revoked')], default='PENDING', max_length=20)),
                ('trigger', models.CharField(choices=[('BEAT', 'Beat'), ('MANUAL', 'Manual'), ('ENQUEUE', 'Enqueued'), ('ADMIN', 'Admin'), ('DIRECT', 'Direct call'), ('CATCH_UP', 'Catch-up'), ('BACKFILL', 'Backfill'), ('UPSTREAM', 'Upstream'), ('ONE_OFF', 'One-off')], default='BEAT', max_length=20)),
                ('skip_reason', models.CharField(blank=True, choices=[('ALREADY_RAN', 'Slot already ran'), ('ALREADY_RUNNING', 'Slot is running'), ('OVERLAP', 'Job already running'), ('PAUSED', 'Job paused'), ('LOCK_UNAVAILABLE', 'Lock unavailable'), ('CONCURRENCY', 'Concurrency limit'), ('UPSTREAM', 'Upstream did not succeed'), ('CANCELLED', 'Cancelled'), ('REMOVED', 'Job removed from the code')], max_length=20)),
                ('forced', models.BooleanField(default=False, help_text='Run past the slot check on purpose')),
                ('force', models.BooleanField(db_default=False, help_text='Sent with --force: runs even while the job is paused, however often it is sent')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('started', models.DateTimeField(blank=True, null=True)),
                ('ended', models.DateTimeField(blank=True, null=True)),
                ('completed', models.BooleanField(default=False)),
                ('success', models.BooleanField(blank=True, null=True)),
                ('message', models.TextField(blank=True)),
                ('error_code', models.CharField(blank=True, max_length=50)),
                ('traceback', models.TextField(blank=True)),
                ('result', models.JSONField(blank=True, null=True)),
                ('retry_count', models.IntegerField(default=0)),
                ('celery_task_id', models.CharField(blank=True, max_length=255)),
                ('worker', models.CharField(blank=True, max_length=255)),
                ('pid', models.IntegerField(blank=True, null=True)),
                ('fence', models.BigIntegerField(blank=True, null=True)),
                ('lease_until', models.DateTimeField(blank=True, help_text="RUNNING: the lease's end; RETRYING: when the next attempt is due", null=True)),
                ('attempts', models.JSONField(blank=True, db_default=models.Value([], output_field=models.JSONField()), help_text='Every attempt once there were two or more: number, status, times, worker, fence, error')),
                ('republished', models.SmallIntegerField(db_default=0, help_text="How often the reconciler sent this execution's message again")),
                ('sentry_checkin_id', models.CharField(blank=True, db_default='', max_length=64)),
                ('waiting_since', models.DateTimeField(blank=True, help_text='PENDING or RETRYING with no room (overlap skip, max_concurrency, its concurrency group): when it began to wait (it runs when a run ends)', null=True)),
                ('due_at', models.DateTimeField(blank=True, help_text='A scheduled slot: when it was due to be sent (the slot plus its jitter)', null=True)),
                ('upstream_execution_id', models.BigIntegerField(blank=True, help_text="The upstream job's execution of this slot that created this one", null=True)),
                ('cascade', models.BooleanField(db_default=False, help_text="Re-run with --cascade: its success runs the downstream jobs' slot again")),
                ('late_alerted', models.BooleanField(db_default=False, help_text="Its LATE alert was recorded (it had not started by the job's start_deadline)")),
                ('long_alerted', models.BooleanField(db_default=False, help_text="Its LONG_RUNNING alert was recorded (still running past the job's max_runtime)")),
                ('params', models.JSONField(blank=True, help_text='The parameter values it runs with (dates as ISO strings); the parameters left out take their declared defaults; empty = none given', null=True)),
                ('params_given', models.BooleanField(db_default=False, help_text="A run with parameters a person gave (--param, the admin, the API): its own execution, neither the slot's regular run nor skipped because the slot ran")),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='executions', to='cron_celery.cronjob')),
            ],
            options={
                'verbose_name': 'cron execution',
                'ordering': ['-slot', '-run_number'],
            },
        ),
        migrations.CreateModel(
            name='CronDependency',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('downstream', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='upstream_edges', to='cron_celery.cronjob')),
                ('upstream', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='downstream_edges', to='cron_celery.cronjob')),
            ],
            options={
                'verbose_name': 'cron dependency',
            },
        ),
        migrations.CreateModel(
            name='Alert',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event', models.CharField(choices=[('FAILED', 'Failed'), ('TIMED_OUT', 'Timed out'), ('LOST', 'Lost'), ('MISSED', 'Missed'), ('RECOVERED', 'Recovered'), ('SUCCEEDED', 'Succeeded'), ('UPSTREAM', 'Upstream failed'), ('LATE', 'Late start'), ('LONG_RUNNING', 'Running too long'), ('TOO_FAST', 'Finished too fast'), ('TOO_FAST_RECOVERED', 'Long enough again')], max_length=20)),
                ('channel', models.CharField(max_length=200)),
                ('status', models.CharField(choices=[('PENDING', 'Pending'), ('SENT', 'Sent'), ('FAILED', 'Failed')], default='PENDING', max_length=10)),
                ('attempts', models.IntegerField(default=0)),
                ('last_error', models.TextField(blank=True)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
                ('facts', models.JSONField(blank=True, db_default=models.Value({}, output_field=models.JSONField()), help_text='What a timing alert was decided on: when a late run was due (due), when a long attempt started (started), how long a fast body took (runtime, seconds); empty for the others')),
                ('execution', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alerts', to='cron_celery.cronexecution')),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alerts', to='cron_celery.cronjob')),
            ],
            options={
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='Durations',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.DateField(help_text="The slots' day (UTC)")),
                ('bucket', models.SmallIntegerField()),
                ('count', models.BigIntegerField(default=0)),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='durations', to='cron_celery.cronjob')),
            ],
        ),
        migrations.CreateModel(
            name='Hour',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hour', models.DateTimeField(help_text="The slots' hour (UTC)")),
                ('ended', models.BigIntegerField(default=0, help_text='Executions of these slots in a final status')),
                ('finished', models.BigIntegerField(default=0, help_text='Those not SKIPPED')),
                ('succeeded', models.BigIntegerField(default=0)),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='hours', to='cron_celery.cronjob')),
            ],
        ),
        migrations.CreateModel(
            name='ScheduleChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job_name', models.CharField(help_text="The job's name when it changed", max_length=100)),
                ('job_code', models.CharField(help_text="The job's code when it changed", max_length=50)),
                ('changed_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), help_text="When, by the database's clock (the statement's start)")),
                ('actor', models.CharField(blank=True, db_default='', help_text="The person (an admin user's name), when the code that made the change knew one", max_length=150)),
                ('db_role', models.CharField(help_text='The database role that made the change (current_user)', max_length=63)),
                ('application_name', models.CharField(blank=True, db_default='', help_text="The connection's application_name", max_length=64)),
                ('source', models.CharField(help_text='Where from: "admin: change form", "deploy (...)", "beat (one_off)", ... or "database" when nobody said', max_length=100)),
                ('changes', models.JSONField(help_text='Each changed attribute as [before, after]: {"schedule": ["0 * * * *", "*/5 * * * *"], "enabled": [true, false]}')),
                ('job', models.ForeignKey(blank=True, db_constraint=False, db_index=False, help_text='Empty once the job is deleted', null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='schedule_changes', to='cron_celery.cronjob')),
            ],
            options={
                'verbose_name': 'schedule change',
                'ordering': ['-id'],
            },
        ),
        migrations.CreateModel(
            name='Tally',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('status', models.CharField(max_length=20)),
                ('bucket', models.SmallIntegerField(help_text='Durations: the number of histogram bounds below them (-1: never started)')),
                ('count', models.BigIntegerField(default=0)),
                ('seconds', models.FloatField(default=0.0, help_text='The durations added up')),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='tallies', to='cron_celery.cronjob')),
            ],
        ),
        migrations.AddIndex(
            model_name='cronjob',
            index=models.Index(condition=models.Q(('schedule_version', models.F('schedule_seen')), _negated=True), fields=['id'], name='cron_job_schedule_edited'),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(fields=['task_code', 'execution_date'], name='cron_exec_code_date'),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(fields=['task_code', 'success', 'execution_date'], name='cron_exec_code_ok_date'),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(fields=['completed'], name='cron_exec_completed'),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(fields=['job', 'status'], name='cron_exec_job_status'),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(condition=models.Q(('celery_task_id', ''), ('status', 'PENDING'), ('trigger', 'ONE_OFF')), fields=['due_at'], name='cron_exec_one_off_due'),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(condition=models.Q(('late_alerted', False), ('status', 'PENDING')), fields=['job'], name='cron_exec_late_unalerted'),
        ),
        migrations.AddIndex(
            model_name='cronexecution',
            index=models.Index(condition=models.Q(('long_alerted', False), ('status', 'RUNNING')), fields=['job'], name='cron_exec_long_unalerted'),
        ),
        migrations.AddConstraint(
            model_name='cronexecution',
            constraint=models.UniqueConstraint(fields=('job', 'slot', 'run_number'), name='cron_execution_once_per_run'),
        ),
        migrations.AddConstraint(
            model_name='crondependency',
            constraint=models.UniqueConstraint(fields=('upstream', 'downstream'), name='cron_dependency_once'),
        ),
        migrations.AddIndex(
            model_name='alert',
            index=models.Index(condition=models.Q(('status', 'PENDING')), fields=['updated_at'], name='cron_alert_pending'),
        ),
        migrations.AddIndex(
            model_name='alert',
            index=models.Index(condition=models.Q(('status', 'FAILED')), fields=['channel', 'updated_at'], name='cron_alert_failed'),
        ),
        migrations.AddConstraint(
            model_name='alert',
            constraint=models.UniqueConstraint(fields=('execution', 'event', 'channel'), name='cron_alert_once'),
        ),
        migrations.AddConstraint(
            model_name='durations',
            constraint=models.UniqueConstraint(fields=('job', 'day', 'bucket'), name='cron_durations_once'),
        ),
        migrations.AddConstraint(
            model_name='hour',
            constraint=models.UniqueConstraint(fields=('job', 'hour'), name='cron_hour_once'),
        ),
        migrations.AddIndex(
            model_name='schedulechange',
            index=models.Index(fields=['job', '-id'], name='cron_change_job_newest'),
        ),
        migrations.AddIndex(
            model_name='schedulechange',
            index=models.Index(fields=['changed_at'], name='cron_change_at'),
        ),
        migrations.AddConstraint(
            model_name='tally',
            constraint=models.UniqueConstraint(fields=('job', 'status', 'bucket'), name='cron_tally_once'),
        ),
            # Each a list of one item: sent whole, never split at the semicolons inside a function.
        migrations.RunSQL([beat_sync.FORWARD], [beat_sync.BACKWARD]),
        migrations.RunSQL([counting.FORWARD], [counting.BACKWARD]),
        migrations.RunSQL([after.FORWARD], [after.BACKWARD]),
        migrations.RunSQL([audit.FORWARD], [audit.BACKWARD]),
    ]
