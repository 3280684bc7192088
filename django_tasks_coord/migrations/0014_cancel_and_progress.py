"""Cooperative cancel and progress of running tasks (:mod:`django_tasks_coord.running`).

- ``Task.cancel_requested_at``: a cancel was requested while the task ran; every write
  that ends its claim ends it CANCELED.
- ``Task.progress``: the latest progress its handler reported (small JSON).
- ``Owner.cancel_requests``: counts cancel requests of tasks the owner holds; its
  heartbeat reads it (a database default, so older nodes still running during a rolling
  upgrade register without it).

Nullable columns and a database default: catalog-only changes (PostgreSQL adds them to
the partitioned parent and so to every partition; MySQL/MariaDB instant ADD COLUMN).
SQLite rebuilds the owner table for its database default, which the ``task_pretty``
view (migration 0010, over the owner table too) would stop: the view is dropped first,
and ``migrate`` creates it again afterwards (:mod:`django_tasks_coord.dbviews`).
"""

from django.db import migrations, models


def drop_view(apps, schema_editor):
    from django_tasks_coord import dbviews

    dbviews.drop(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ('django_tasks_coord', '0013_observability'),
    ]

    operations = [
        migrations.RunPython(drop_view, migrations.RunPython.noop),
        migrations.AddField(
            model_name='owner',
            name='cancel_requests',
            field=models.PositiveBigIntegerField(db_default=0, default=0, help_text='Counts cancel requests of running tasks it holds; its heartbeat reads it (django_tasks_coord.running).', verbose_name='cancel requests'),
        ),
        migrations.AddField(
            model_name='task',
            name='cancel_requested_at',
            field=models.DateTimeField(blank=True, help_text='A cancel was requested while it ran: its handler is asked to stop, and it ends CANCELED however the handler ends.', null=True, verbose_name='cancel requested at'),
        ),
        migrations.AddField(
            model_name='task',
            name='progress',
            field=models.JSONField(blank=True, help_text='What its handler last reported of its progress (a small JSON value).', null=True, verbose_name='progress'),
        ),
    ]
