"""Pruning: deleting finished tasks, in batches that never wait for a locked row.

:func:`purge` (a topic's tasks below a sequence, ``queue.purge``), the batches of a
retention pass (:func:`delete_by_state`, :mod:`django_tasks_coord.retention` decides
what goes) and old ``django.tasks`` results (:func:`delete_finished`).

Each batch reads the next candidates of one topic and state in sequence order from the
``(topic, state, sequence)`` index and deletes, in one short transaction of its own,
those still victims. On PostgreSQL and MySQL/MariaDB the batch's rows are picked with
``SELECT ... FOR UPDATE SKIP LOCKED``: pruning never waits for a row another
transaction holds; what is skipped goes in a later pass. SQLite has no row locks: the
rows are picked first and deleted in a write transaction that checks the victims'
filter again.

A task's checkpoints (:mod:`~.checkpoints`) go with it, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from django.db import connections, transaction
from django.db.models import QuerySet

from django_tasks_coord import db
from django_tasks_coord.enums import IN_FLIGHT
from django_tasks_coord.models import Task
from django_tasks_coord.store import checkpoints

__all__ = ["Budget", "Sweeps", "delete_by_state", "delete_finished", "purge", "rows_threshold"]


def purge(topic: str, below: int) -> int:
    """Delete the tasks of ``topic`` with a sequence lower than ``below`` that are not in
    flight; return how many."""
    doomed = (
        Task.objects.using(db.alias())
        .for_topic(topic)
        .filter(sequence__lt=below)
        .exclude(state__in=IN_FLIGHT)
    )
    with db.write_transaction():
        deleted, _ = doomed.delete()
        checkpoints.delete_orphans(below=below)
    return deleted


class Budget:
    """Batches a pass may still run; ``None``: no limit."""

    def __init__(self, batches: int | None) -> None:
        self.left = batches
        self.cut_short = False  # work was left for later because the budget ran out

    @property
    def spent(self) -> bool:
        """True once no batch is left; asking marks the pass as cut short."""
        if self.left is not None and self.left <= 0:
            self.cut_short = True
            return True
        return False

    def take(self) -> None:
        if self.left is not None:
            self.left -= 1


#: Where a node's sweep of one (topic, state, limit) stopped: the last sequence it read.
Sweeps = dict[tuple[str, int, str], int]


def delete_finished(
    topic: str,
    states: Iterable[int],
    *,
    before: datetime,
    batch_size: int,
    max_batches: int | None = None,
) -> int:
    """Delete ``topic``'s tasks in ``states`` that finished before ``before``; return how many.

    In batches of ``batch_size`` rows, each its own transaction, skipping rows that
    other transactions hold (PostgreSQL, MySQL/MariaDB); at most ``max_batches``
    batches. Used to prune old ``django.tasks`` results
    (:func:`django_tasks_coord.backends.housekeeping.prune_results`): unlike a retention
    pass, it reads the candidates with their ``finished_at`` (no sweep bound), so every task
    finished before ``before`` goes, whatever its creation time.
    """
    old = Task.objects.using(db.alias()).filter(
        topic_id=topic, state__in=list(states), finished_at__lt=before
    )
    deleted, _ = _delete_range(old, old, batch_size, Budget(max_batches))
    return deleted


def _delete_range(
    window: QuerySet[Task],
    victims: QuerySet[Task],
    batch_size: int,
    budget: Budget,
    after: int = 0,
) -> tuple[int, int]:
    """Walk ``window`` in sequence order from after ``after``, ``batch_size`` candidates at a
    time, deleting those that are ``victims``, until the window is exhausted or ``budget``
    is spent. Returns the tasks deleted and where the next walk resumes (``0``: from the
    window's start, as it was exhausted)."""
    deleted = 0
    while True:
        candidates = list(
            window.filter(sequence__gt=after)
            .order_by("sequence")
            .values_list("sequence", flat=True)[:batch_size]
        )
        if not candidates:
            return deleted, 0
        if budget.spent:  # candidates are left: for the next walk
            return deleted, after
        budget.take()
        deleted += _delete_batch(victims, candidates)
        after = candidates[-1]
        if len(candidates) < batch_size:
            return deleted, 0


def delete_by_state(
    topic: str,
    states: Sequence[int],
    batch_size: int,
    budget: Budget,
    *,
    before: datetime | None = None,
    below: int | None = None,
    sweeps: Sweeps | None = None,
) -> int:
    """Delete, state by state, ``topic``'s tasks in ``states`` finished before ``before`` and
    with a sequence under ``below`` (each bound optional), until none is left or the
    budget is spent; return how many went.

    Each batch reads the next ``batch_size`` candidates of one state in sequence order
    from the ``(topic, state, sequence)`` index alone (an index-only range: the
    planner cannot mistake a walk of the primary key through other topics' rows for
    it), then locks and deletes those of them that are still victims. ``sweeps``
    remembers, from one pass to the next, where the sweep of each state stopped, so
    that candidates that are no victims (tasks finished after ``before`` though
    created before it) are not read again at every pass.
    """
    tasks = Task.objects.using(db.alias())
    limit = below
    if before is not None:
        # A task finishes after it is created: the tasks finished before ``before`` were
        # created before it too. The sequence of the first task created after ``before``
        # (index (topic, created_at)) bounds the sweep, so that the tasks still kept are
        # not read at every pass. Tasks whose creation and sequence disagree (a long
        # transaction, clock skew) are only deleted a little later, never earlier.
        bound = (
            tasks.filter(topic_id=topic, created_at__gt=before)
            .order_by("created_at")
            .values_list("sequence", flat=True)
            .first()
        )
        limit = bound if limit is None or bound is None else min(limit, bound)
    kind = "rows" if before is None else "days"
    deleted = 0
    for state in states:
        victims = tasks.filter(topic_id=topic, state=state)
        if before is not None:
            victims = victims.filter(finished_at__lt=before)
        window = tasks.filter(topic_id=topic, state=state)
        if limit is not None:
            window = window.filter(sequence__lt=limit)
        key = (topic, state, kind)
        after = sweeps.get(key, 0) if sweeps is not None else 0
        removed, after = _delete_range(window, victims, batch_size, budget, after)
        deleted += removed
        if sweeps is not None:
            sweeps[key] = after
    return deleted


def _delete_batch(victims: QuerySet[Task], candidates: list[int]) -> int:
    """Delete those of ``candidates`` (sequences) that are still ``victims``, in one short
    transaction; return how many went. Rows another transaction holds are skipped."""
    conn = db.connection()
    chosen = victims.filter(sequence__in=candidates)
    if conn.features.has_select_for_update_skip_locked:
        with transaction.atomic(using=db.alias()):
            locked = chosen.values_list("sequence", flat=True).select_for_update(
                **db.lock_kwargs(conn)
            )
            pks = list(locked)
            if not pks:
                return 0
            # The topic stays in the WHERE: one partition of a partitioned table.
            deleted = victims.filter(sequence__in=pks).delete()[0]
            checkpoints.delete_of(pks)
            return deleted
    # SQLite: no row locks, one writer at a time; the delete checks the policy itself.
    with db.write_transaction():
        pks = list(chosen.values_list("sequence", flat=True))
        deleted = chosen.delete()[0]
        checkpoints.delete_of(pks)
        return deleted


def rows_threshold(topic: str, states: Sequence[int], keep: int) -> int | None:
    """The sequence of the ``keep``-th newest task of ``topic`` in ``states`` (``keep`` >= 1):
    the tasks below it go. ``None`` if there are not more than ``keep``.

    Each state's newest ``keep`` sequences are a backward range of the
    ``(topic, state, sequence)`` index; the threshold is the ``keep``-th of their union.
    """
    alias = db.alias()
    tasks = Task.objects.using(alias).filter(topic_id=topic)
    if len(states) == 1:
        by_age = tasks.filter(state=states[0]).order_by("-sequence")
        found = by_age.values_list("sequence", flat=True)[keep - 1 : keep]
        return next(iter(found), None)
    conn = connections[alias]
    column = conn.ops.quote_name("sequence")
    parts, params = [], []
    for i, state in enumerate(states):
        newest = tasks.filter(state=state).order_by("-sequence").values_list("sequence")[:keep]
        sql, part_params = newest.query.get_compiler(using=alias).as_sql()
        parts.append(f"SELECT {column} FROM ({sql}) {conn.ops.quote_name(f'newest_{i}')}")
        params.extend(part_params)
    sql = " UNION ALL ".join(parts) + f" ORDER BY {column} DESC LIMIT 1 OFFSET {int(keep) - 1}"
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else int(row[0])
