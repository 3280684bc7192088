"""Writes of job runs: the task rows scheduling inserts, and a fenced run's finish.

A run of a job is a task of the jobs topic (or of a group's leader topic) whose
identifier is the job id and whose ``slot`` is the time it fires for. Scheduling
decides which runs to submit; the rows are written here. The job rows themselves
(``periodic_task``) are not the task table: scheduling writes those.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db import IntegrityError

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from django_tasks_coord.store.claims import end_claims
from django_tasks_coord.store.fencing import held
from django_tasks_coord.store.insert import insert


def insert_run(run: Task, *, using: str | None = None) -> Task:
    """Insert one run outside any slot (``run_now``) and wake its topic's nodes.

    Runs in the caller's transaction, if one is open.
    """
    return insert([run], using=using)[0]


def insert_runs(
    batches: Sequence[Sequence[Task]], *, using: str | None = None
) -> list[list[Task] | None]:
    """Insert the runs of several jobs (one batch per job) and wake their topics' nodes.

    One statement for every batch; if it conflicts with a run that exists already (the
    unique (topic, identifier, slot) constraint), each batch is inserted on its own and
    only the batches that conflict are left out. Returns, per batch and in the order
    given, the inserted runs, or None for a batch that conflicted. Each attempt runs in
    a savepoint of the caller's transaction.
    """
    using = using or db.alias()
    try:
        with db.write_transaction():
            created = insert([run for batch in batches for run in batch], using=using)
    except IntegrityError:
        return [_insert_batch(batch, using) for batch in batches]
    inserted: list[list[Task] | None] = []
    for batch in batches:
        inserted.append(created[: len(batch)])
        created = created[len(batch) :]
    return inserted


def _insert_batch(batch: Sequence[Task], using: str) -> list[Task] | None:
    if not batch:
        return []
    try:
        with db.write_transaction():
            return insert(list(batch), using=using)
    except IntegrityError:
        return None


def succeed_held_run(run: Task, *, finished_at: datetime, using: str | None = None) -> bool:
    """Mark ``run`` SUCCEEDED if it is still ACTIVE under its claim; whether it was.

    The last step of :meth:`~django_tasks_coord.scheduling.runner.JobContext.fenced`,
    inside the caller's fenced transaction. A run whose cancel was requested ends
    CANCELED instead (:func:`~.claims.end_claims`; ``run.state`` says so).
    """
    changes = {"state": TaskState.SUCCEEDED, "finished_at": finished_at, "owner": None}
    written, canceled = end_claims(held([run], using=using), changes, 1)
    if canceled:
        run.state = TaskState.CANCELED
    return written == 1


__all__ = ["insert_run", "insert_runs", "succeed_held_run"]
