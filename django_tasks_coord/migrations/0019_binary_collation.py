"""MariaDB/MySQL: every table of the package compares text byte for byte (case, accents and
trailing spaces count), as on PostgreSQL and SQLite. Created in the database's default
collation, case-blind by default, the tables took "Order-1" and "order-1" for one identifier
(an insertion mode replaced the wrong task) and "a" and "a " for one key.

Rebuilds each table (MariaDB/MySQL copy it; writes wait meanwhile): on a large task table,
migrate in a quiet hour. Nothing to do on PostgreSQL and SQLite. See
:mod:`django_tasks_coord.db.collation`.
"""

from django.db import migrations


def to_binary(apps, schema_editor):
    from django_tasks_coord.db.collation import make_binary

    config = apps.get_app_config("django_tasks_coord")
    tables = [model._meta.db_table for model in config.get_models(include_auto_created=True)]
    make_binary(schema_editor.connection, tables)


class Migration(migrations.Migration):
    atomic = False  # MariaDB/MySQL commit each ALTER TABLE anyway

    dependencies = [("django_tasks_coord", "0018_checkpoints")]

    operations = [migrations.RunPython(to_binary, migrations.RunPython.noop, elidable=False)]
