"""Maintenance of a topic's history: :func:`purge`, :func:`resolve` and :func:`count`.
Re-exported by :mod:`~django_tasks_coord.queue`; the task store deletes what
:func:`purge` asks for (:func:`django_tasks_coord.store.prune.purge`)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Max, Min

from django_tasks_coord import db
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task
from django_tasks_coord.store import prune
from django_tasks_coord.topics import TopicRef, topic_name
from django_tasks_coord.validation import check_when


def purge(topic: TopicRef, below: int) -> int:
    """Delete the tasks of ``topic`` with a sequence lower than ``below``; return how many.

    Tasks in flight (ACTIVE, REQUESTED) are kept: purging never pulls work from
    under a running consumer.
    """
    if not isinstance(below, int) or isinstance(below, bool):
        raise InvalidArgumentError(f"below must be an int (a sequence), not {below!r}.")
    return prune.purge(topic_name(topic), below)


def resolve(topic: TopicRef, when: datetime) -> int:
    """The first sequence of ``topic`` created after ``when`` (by the database clock).

    If nothing was created since, the sequence the next task will be above, so
    ``purge(topic, resolve(topic, when))`` removes everything created up to ``when``.
    """
    name = topic_name(topic)
    check_when(when, "when", optional=False)
    tasks = Task.objects.using(db.alias())
    first = tasks.for_topic(name).filter(created_at__gt=when).aggregate(m=Min("sequence"))["m"]
    if first is not None:
        return int(first)
    return int(tasks.aggregate(m=Max("sequence"))["m"] or 0) + 1


def count(
    topic: TopicRef,
    *,
    start: int | None = None,
    end: int | None = None,
    latest_per_identifier: bool = False,
) -> int:
    """Count the tasks of ``topic`` with ``start <= sequence < end`` (either bound optional).

    With ``latest_per_identifier`` each identifier counts once (its latest task).
    """
    for argument, value in (("start", start), ("end", end)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidArgumentError(
                f"{argument} must be an int (a sequence) or None, not {value!r}."
            )
    qs = Task.objects.using(db.alias()).for_topic(topic_name(topic))
    if start is not None:
        qs = qs.filter(sequence__gte=start)
    if end is not None:
        qs = qs.filter(sequence__lt=end)
    if latest_per_identifier:
        return int(qs.aggregate(n=Count("identifier", distinct=True))["n"])
    return qs.count()
