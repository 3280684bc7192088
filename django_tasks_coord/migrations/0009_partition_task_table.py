"""PostgreSQL: the task table partitioned by topic (``TASKS_COORD["PARTITION_TASKS"]``).

Converted here only while the table is empty (a new installation); a table with
history is left as it is, and ``manage.py tasks_coord_partition`` converts it online,
in batches (system check ``tasks_coord.W004`` says so). See
:mod:`django_tasks_coord.partitions`.
"""

import logging

from django.db import migrations

logger = logging.getLogger("django_tasks_coord.partitions")


def partition_if_empty(apps, schema_editor):
    from django_tasks_coord import partitions

    connection = schema_editor.connection
    if not partitions.wanted(connection) or partitions.is_partitioned(connection):
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {connection.ops.quote_name(partitions.table())})"
        )
        if cursor.fetchone()[0]:
            logger.warning(
                "The task table holds tasks, so migrate leaves it unpartitioned; run "
                "`manage.py tasks_coord_partition` to partition it online."
            )
            return
    partitions.convert(connection.alias, partitioned=True)


class Migration(migrations.Migration):
    dependencies = [("django_tasks_coord", "0008_topic_retention")]

    operations = [migrations.RunPython(partition_if_empty, migrations.RunPython.noop)]
