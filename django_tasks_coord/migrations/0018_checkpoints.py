"""Checkpoints of running tasks (:mod:`django_tasks_coord.running`, composite steps): a new
table, one row per task and name, deleted with its task by the task store.

No foreign key constraint to the task table (it may be partitioned on PostgreSQL); a new
table only, so nodes of the previous release keep running during a rolling upgrade.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_tasks_coord', '0017_workflows'),
    ]

    operations = [
        migrations.CreateModel(
            name='Checkpoint',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=200, verbose_name='name')),
                ('value', models.JSONField(blank=True, null=True, verbose_name='value')),
                ('attempt', models.PositiveIntegerField(help_text="The task's attempt that wrote it (its attempts count then).", verbose_name='attempt')),
                ('exec_id', models.UUIDField(help_text='The claim it was written under (fencing).', verbose_name='execution id')),
                ('written_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), verbose_name='written at')),
                ('task', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='checkpoints', to='django_tasks_coord.task', verbose_name='task')),
            ],
            options={
                'verbose_name': 'checkpoint',
                'verbose_name_plural': 'checkpoints',
                'default_permissions': (),
                'constraints': [models.UniqueConstraint(fields=('task', 'name'), name='tasks_coord_checkpoint_name')],
            },
        ),
    ]
