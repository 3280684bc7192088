"""Flow control: the topic's limits (``rate_limit``, ``concurrency_limit``, ``limit_key``,
``fair``, and ``fair_cursor``, where fair claims resume) and the log of rate-limited starts
(``FlowStart``).

The topic's new columns have database defaults (or are nullable), so nodes of the previous
release still running during a rolling upgrade insert topics without them.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_tasks_coord', '0014_cancel_and_progress'),
    ]

    operations = [
        migrations.AddField(
            model_name='topic',
            name='concurrency_limit',
            field=models.PositiveIntegerField(blank=True, help_text='At most this many tasks active at once.', null=True, verbose_name='concurrency limit'),
        ),
        migrations.AddField(
            model_name='topic',
            name='fair',
            field=models.BooleanField(db_default=False, default=False, help_text='Claim round-robin across limit keys instead of oldest first.', verbose_name='fair claims'),
        ),
        migrations.AddField(
            model_name='topic',
            name='fair_cursor',
            field=models.CharField(blank=True, db_default='', default='', editable=False, help_text='The key a fair claim served last: the next one starts after it.', max_length=255, verbose_name="fair claims' cursor"),
        ),
        migrations.AddField(
            model_name='topic',
            name='limit_key',
            field=models.CharField(blank=True, db_default='', default='', help_text='What partitions the limits (each key gets them whole): "identifier", "payload.<path>" or "callable:<name>"; empty: the topic as a whole. Applies to tasks pushed after it is set.', max_length=200, verbose_name='limit key'),
        ),
        migrations.AddField(
            model_name='topic',
            name='rate_limit',
            field=models.CharField(blank=True, db_default='', default='', help_text='At most this many task starts per period, e.g. "50/s", "1000/m", "10/h".', max_length=32, verbose_name='rate limit'),
        ),
        migrations.CreateModel(
            name='FlowStart',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('topic', models.CharField(max_length=100, verbose_name='topic')),
                ('key', models.CharField(blank=True, default='', max_length=255, verbose_name='key')),
                ('at', models.DateTimeField(verbose_name='at')),
                ('count', models.PositiveIntegerField(verbose_name='count')),
            ],
            options={
                'verbose_name': 'rate-limited start',
                'verbose_name_plural': 'rate-limited starts',
                'default_permissions': (),
                'indexes': [models.Index(fields=['topic', 'at'], name='tasks_coord_flow_start_at')],
            },
        ),
    ]
