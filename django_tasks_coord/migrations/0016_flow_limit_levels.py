"""Flow control on two levels and per key value: the topic-wide limits
(``total_rate_limit``, ``total_concurrency_limit``) that hold with the per-key ones, and
the limits of particular key values (``key_limits``: ``@task`` functions' and job runs'
limits are entries there).

The new columns have a database default or are nullable, so nodes of the previous release
still running during a rolling upgrade insert topics without them.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_tasks_coord', '0015_flow_control'),
    ]

    operations = [
        migrations.AddField(
            model_name='topic',
            name='key_limits',
            field=models.JSONField(blank=True, default=None, help_text='Limits of particular key values instead of the per-key ones, e.g. {"acme": {"rate": "10/s", "concurrency": 2}}. @task functions with rate or concurrency and job runs with limits are entries here.', null=True, verbose_name='limits of key values'),
        ),
        migrations.AddField(
            model_name='topic',
            name='total_concurrency_limit',
            field=models.PositiveIntegerField(blank=True, help_text='At most this many tasks of the topic active at once, whatever the limit key (the concurrency limit then holds per key).', null=True, verbose_name='total concurrency limit'),
        ),
        migrations.AddField(
            model_name='topic',
            name='total_rate_limit',
            field=models.CharField(blank=True, db_default='', default='', help_text='At most this many task starts per period for the topic as a whole, whatever the limit key (the rate limit then holds per key).', max_length=32, verbose_name='total rate limit'),
        ),
    ]
