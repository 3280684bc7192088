"""The task store: the one place that writes rows of the task table.

Every ``INSERT``, ``UPDATE`` and ``DELETE`` on :class:`~django_tasks_coord.models.Task`
goes through a function of this package: inserting (with its NOTIFY), claiming,
finishing (fenced by the claim's ``exec_id``), releasing, cancelling, returning the
work of dead owners to the queue, the attempt log and pruning. The queue, scheduling,
the executor API, owners, revival, the ``django.tasks`` backend and the node call it;
none of them writes task rows itself (``tests/test_task_store_rule.py`` keeps it so).

This module re-exports; the implementation lives in its submodules, one per kind of
write: :mod:`~.fencing` (the one predicate of a claim still held), :mod:`~.insert`
(pushes with their insertion mode, created and recreated tasks, each announced),
:mod:`~.claims` (poll, release, return-to-queue of dead owners; each database's claim
statement in :mod:`~.claim_statements`), :mod:`~.cancels`
(cancels and cancel requests),
:mod:`~.finish` (the queue's completions, an executor's reports), :mod:`~.handout`
(the executor API's claim and its start timeout), :mod:`~.progress` (running
tasks' progress), :mod:`~.checkpoints` (what running tasks recorded as done, the
checkpoint table's one writer), :mod:`~.revive` (reset, recreate,
junction) and :mod:`~.prune` (purge, retention batches, old results). :mod:`~.workflows` writes the
rows of the workflow tables (it is imported by name, not re-exported here).
"""

from __future__ import annotations

from django_tasks_coord.store import (
    cancels,
    checkpoints,
    claims,
    finish,
    handout,
    insert,
    progress,
    prune,
    revive,
)
from django_tasks_coord.store.attempts import write_log
from django_tasks_coord.store.completion import Change, write_changes
from django_tasks_coord.store.fencing import held
from django_tasks_coord.store.jobs import insert_run, insert_runs, succeed_held_run
from django_tasks_coord.store.terms import stamp_term

__all__ = [
    "Change",
    "cancels",
    "checkpoints",
    "claims",
    "finish",
    "handout",
    "held",
    "insert",
    "insert_run",
    "insert_runs",
    "progress",
    "prune",
    "revive",
    "stamp_term",
    "succeed_held_run",
    "write_changes",
    "write_log",
]
