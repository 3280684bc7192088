"""Node start-up for Django tasks, and pruning old results.

:func:`prepare_node` runs in every ``runscheduler`` process (imported through the
app's ``consumers`` module): it registers the topics of the configured queues, makes
the node process them, imports every installed app's ``tasks`` module (so periodic
tasks are declared before the node syncs declared jobs) and, when a backend sets
``RESULT_RETENTION``, declares the hourly job that prunes old results.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta

from django.utils import timezone
from django.utils.module_loading import autodiscover_modules

from django_tasks_coord import db, topics
from django_tasks_coord.backends.backend import DatabaseBackend, coord_backends
from django_tasks_coord.backends.worker import DJANGO_TASK_TYPE
from django_tasks_coord.enums import COMPLETED_MAX, COMPLETED_MIN, TaskState
from django_tasks_coord.handlers import registry
from django_tasks_coord.models import Task as TaskRow
from django_tasks_coord.retention import delete_finished
from django_tasks_coord.scheduling import declared

logger = logging.getLogger(__name__)

#: The declared job that prunes results past their backend's ``RESULT_RETENTION``.
PRUNE_JOB = "tasks_coord.prune_task_results"
PRUNE_BATCH = 1000


def prepare_node() -> None:
    """Make this process's node run the tasks of every ``DatabaseBackend`` (see the module docstring)."""
    backends = coord_backends()
    if not backends:
        return
    consumers = registry.consumers()
    for backend in backends:
        for name in sorted(backend.queues):
            topics.register_topic(name)
            if name not in consumers:
                registry.add(name, dataclasses.replace(DJANGO_TASK_TYPE, name=name))
    autodiscover_modules("tasks")
    if any(backend.result_retention is not None for backend in backends):
        declared.job("hourly", name=PRUNE_JOB)(prune_job)


def prune_job(ctx: object) -> None:
    """The hourly job: :func:`prune_results` with each backend's retention."""
    prune_results()


def prune_results(
    backends: list[DatabaseBackend] | None = None,
    *,
    older_than: timedelta | None = None,
    dry_run: bool = False,
) -> dict[str, int]:
    """Delete finished results older than ``older_than`` (default: each backend's retention).

    Only completed tasks (succeeded, failed, cancelled...) of the backends' queues whose
    ``finished_at`` is older go, in batches of :data:`PRUNE_BATCH` rows; waiting and
    running tasks are never touched. Returns the rows deleted (with ``dry_run``: that
    would be) per backend alias; a backend without a retention is skipped. Each batch is
    deleted like topic retention's (:func:`django_tasks_coord.retention.delete_finished`):
    one topic at a time, in a transaction of its own, rows held by other transactions
    skipped.
    """
    counts: dict[str, int] = {}
    for backend in coord_backends() if backends is None else backends:
        retention = older_than if older_than is not None else backend.result_retention
        if retention is None:
            continue
        cutoff = timezone.now() - retention
        if dry_run:
            old = TaskRow.objects.using(db.alias()).filter(
                topic_id__in=backend.topics(),
                state__gte=COMPLETED_MIN,
                state__lte=COMPLETED_MAX,
                finished_at__lt=cutoff,
            )
            counts[backend.alias] = old.count()
            continue
        deleted = 0
        for topic in backend.topics():
            deleted += delete_finished(
                topic, TaskState.completed_states(), before=cutoff, batch_size=PRUNE_BATCH
            )
        counts[backend.alias] = deleted
        if deleted:
            logger.info("Pruned %s result(s) of task backend %r.", deleted, backend.alias)
    return counts
