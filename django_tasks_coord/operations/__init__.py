"""Day-2 operations: find tasks, revive or cancel them in bulk, pause topics and jobs, look at nodes.

``manage.py tasks_coord`` is a thin shell over this package; the admin's actions call the
same services (:mod:`~django_tasks_coord.revival`, :mod:`~django_tasks_coord.queue`,
:mod:`~django_tasks_coord.topics`, :mod:`~django_tasks_coord.scheduling`). Use it from
Python too::

    from django_tasks_coord import operations
    from django_tasks_coord.operations import Action, TaskFilter

    selection = TaskFilter(topic="invoices", older_than=operations.parse_age("1h"))
    preview = operations.bulk(Action.RETRY, selection, dry_run=True, actor="ops:alice")
    done = operations.bulk(Action.RETRY, selection, actor="ops:alice")

Bulk actions work in batches of :data:`BATCH_SIZE` tasks, each in a transaction of its
own: the candidates are read in sequence order (keyset pagination, no ``OFFSET``), then
locked with ``SKIP LOCKED`` and changed if they are still eligible. A task that changed
meanwhile, or that a node holds locked at that moment, is left alone and counted as
skipped; run the action again for those. Every action is logged on the
``django_tasks_coord.operations`` logger at INFO: who (``actor``), what (the action and
the filter) and how many.

Its modules, whose names are all re-exported here:
:mod:`~django_tasks_coord.operations.selection` (ages, states, :class:`TaskFilter`,
listing and showing tasks), :mod:`~django_tasks_coord.operations.actions`
(:func:`bulk`), :mod:`~django_tasks_coord.operations.controls` (topics and jobs) and
:mod:`~django_tasks_coord.operations.nodes` (nodes and leaders).
"""

from __future__ import annotations

from django_tasks_coord.operations.actions import BATCH_SIZE, Action, Batch, BulkResult, bulk
from django_tasks_coord.operations.controls import (
    all_jobs_paused,
    job_data,
    list_jobs,
    list_topics,
    run_job,
    set_jobs_paused,
    set_topics_paused,
)
from django_tasks_coord.operations.nodes import (
    age_of,
    alive_of,
    alive_since,
    holders_with_health,
    list_leaders,
    list_nodes,
    owners_with_health,
)
from django_tasks_coord.operations.selection import (
    MAX_LIST,
    TaskFilter,
    get_task,
    list_tasks,
    parse_age,
    parse_state,
    state_name,
    task_data,
)

__all__ = [
    "BATCH_SIZE",
    "MAX_LIST",
    "Action",
    "Batch",
    "BulkResult",
    "TaskFilter",
    "age_of",
    "alive_of",
    "alive_since",
    "all_jobs_paused",
    "bulk",
    "get_task",
    "holders_with_health",
    "job_data",
    "list_jobs",
    "list_leaders",
    "list_nodes",
    "list_tasks",
    "list_topics",
    "owners_with_health",
    "parse_age",
    "parse_state",
    "run_job",
    "set_jobs_paused",
    "set_topics_paused",
    "state_name",
    "task_data",
]
