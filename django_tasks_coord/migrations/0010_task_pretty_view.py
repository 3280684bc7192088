"""The ``task_pretty`` view (``TASKS_COORD["TASK_PRETTY_VIEW"]``); see :mod:`django_tasks_coord.dbviews`.

``migrate`` also keeps it up to date: it drops the view before migrating and creates it
again afterwards with the task table's columns of the day.
"""

from django.db import migrations


def create_view(apps, schema_editor):
    from django_tasks_coord import dbviews

    if dbviews.wanted():
        dbviews.create(schema_editor.connection)


def drop_view(apps, schema_editor):
    from django_tasks_coord import dbviews

    dbviews.drop(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("django_tasks_coord", "0009_partition_task_table")]

    operations = [migrations.RunPython(create_view, drop_view)]
