"""Observability: ``Task.traceparent``, ``PeriodicTask.missed_slots``, ``view_metrics``.

- ``traceparent`` (nullable, no default): the W3C trace context of the span that pushed a
  task (:mod:`django_tasks_coord.tracing`). Adding it is a catalog-only change everywhere:
  on PostgreSQL the column is added to the partitioned parent and so to every partition
  (:mod:`django_tasks_coord.partitions`) without rewriting them; on MySQL/MariaDB it is
  added after the virtual column ``unfinished_identifier`` of migration 0011, which stays
  as it is (instant ADD COLUMN); SQLite's ADD COLUMN.
- ``missed_slots``: due slots of a job that never ran, counted by the scheduler
  (``tasks_coord_job_missed_slots_total``). A database default, so older nodes still
  running during a rolling upgrade insert jobs without it.
- The ``view_metrics`` permission of the dashboard: who may scrape the metrics view
  (:mod:`django_tasks_coord.metrics.views`).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_tasks_coord', '0012_admin_verbose_names'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='dashboard',
            options={'default_permissions': ('view',), 'permissions': [('view_metrics', 'Can scrape the Prometheus metrics')], 'verbose_name': 'dashboard', 'verbose_name_plural': 'dashboard'},
        ),
        migrations.AddField(
            model_name='periodictask',
            name='missed_slots',
            field=models.PositiveBigIntegerField(db_default=0, default=0, help_text='Due slots never run (missed-slot policy), since the job was created.', verbose_name='missed slots'),
        ),
        migrations.AddField(
            model_name='task',
            name='traceparent',
            field=models.CharField(blank=True, editable=False, max_length=55, null=True, verbose_name='traceparent'),
        ),
    ]
