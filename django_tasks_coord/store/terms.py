"""Leader terms on leader-only runs: the stamp that fences a run to the term it was claimed under.

A run of a group's leader-only job is claimed by the group's leader; right after the
claim the node stamps the runs with the term it leads under, in one ``UPDATE`` that
applies only while the claim still holds (:func:`~django_tasks_coord.store.fencing.held`)
and the node still holds the group's token under that term. A run without a term is never
started (:mod:`django_tasks_coord.node.execution`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.db.models import Exists

from django_tasks_coord import db
from django_tasks_coord.models import Task, TokenHolder
from django_tasks_coord.store.fencing import held

__all__ = ["stamp_term"]


def stamp_term(
    tasks: Sequence[Task],
    *,
    group: str,
    node_id: str,
    term: int,
    wait: Callable[[float], bool] | None = None,
) -> int:
    """Stamp ``term`` on those of ``tasks`` still held under their claim, if ``node_id``
    still holds ``group``'s token under ``term``; return how many rows were stamped.

    Repeated while the database connection is lost (the same ``UPDATE`` again is
    harmless), waiting with ``wait`` as :func:`django_tasks_coord.db.retry_while_lost`
    does. The tasks in memory are left as they are: the caller sets their ``term`` once
    it knows that every one of them was stamped.
    """
    alias = db.alias()
    holder = TokenHolder.objects.using(alias).filter(group_id=group, task_id=node_id, term=term)
    rows = held(tasks, using=alias).filter(Exists(holder))
    return db.retry_while_lost(
        lambda: rows.update(term=term), what="Stamping leader-only runs", wait=wait
    )
