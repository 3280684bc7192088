"""Topics: registering them, pausing and resuming them, and their failure streaks.

Re-exported by :mod:`django_tasks_coord.queue` (``queue.register_topic``...).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError
from django.db.models import F
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from django_tasks_coord import db, partitions
from django_tasks_coord.exceptions import (
    InvalidArgumentError,
    ReservedTopicError,
    UnknownTopicError,
)
from django_tasks_coord.models import Topic

logger = logging.getLogger(__name__)

#: The prefix of this package's own topics; :func:`register_topic` refuses it.
RESERVED_PREFIX = "tasks_coord."

#: A topic given by name or as a :class:`~django_tasks_coord.models.Topic`.
TopicRef = str | Topic


#: The topic's flow limit columns, in the order ``flow.Limits.of`` takes them.
LIMIT_FIELDS = (
    "rate_limit",
    "concurrency_limit",
    "limit_key",
    "fair",
    "total_rate_limit",
    "total_concurrency_limit",
    "key_limits",
)


class _KnownTopics:
    """Names of topics seen to exist, remembered for a short while to spare a query per push.

    A topic is rarely deleted (it is PROTECTed while it has tasks); an entry expires
    after ``ttl`` seconds and is dropped at once when this process deletes the topic.
    An entry can still be stale (the tables were flushed, another process deleted the
    topic): :func:`adding_tasks` trusts it only where it can catch and heal that.

    Each entry also keeps the topic's flow limits as read with it (:data:`LIMIT_FIELDS`,
    :mod:`django_tasks_coord.flow`): a push gives its tasks their key, and a claim soon
    after knows whether the topic is limited, without a query of their own.
    """

    ttl = 60.0

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, tuple[Any, ...] | None]] = {}
        self._lock = threading.Lock()

    def __contains__(self, name: str) -> bool:
        seen = self._seen.get(name)
        return seen is not None and time.monotonic() - seen[0] < self.ttl

    def add(self, name: str, limits: tuple[Any, ...] | None = None) -> None:
        """Remember ``name`` (and its :data:`LIMIT_FIELDS` values; None: not read)."""
        with self._lock:
            self._seen[name] = (time.monotonic(), limits)

    def limits(self, name: str, max_age: float | None = None) -> tuple[Any, ...] | None:
        """The :data:`LIMIT_FIELDS` values read with the topic, if it is known, was read
        with them, less than ``max_age`` seconds ago (default: the entry's ``ttl``)."""
        seen = self._seen.get(name)
        age = self.ttl if max_age is None else max_age
        if seen is None or time.monotonic() - seen[0] >= age:
            return None
        return seen[1]

    def discard(self, name: str) -> None:
        with self._lock:
            self._seen.pop(name, None)

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()


known_topics = _KnownTopics()


@receiver(post_delete, sender=Topic)
def _forget_deleted_topic(sender: type[Topic], instance: Topic, **kwargs: Any) -> None:
    known_topics.discard(instance.name)


@receiver(post_save, sender=Topic)
def _partition_new_topic(
    sender: type[Topic], instance: Topic, created: bool, using: str, **kwargs: Any
) -> None:
    """A new topic gets its partition of the task table (PostgreSQL, when partitioned).

    :func:`register_topic` has made it already; this covers topics saved otherwise.
    """
    if created:
        partitions.ensure_partition(instance.name, using)


def validate_topic_name(name: object) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= 100 or name != name.strip():
        raise InvalidArgumentError(
            f"A topic name must be a non-empty str of at most 100 characters without "
            f"surrounding spaces, not {name!r}."
        )
    return name


def name_of(topic: object) -> str:
    """The name of a topic reference (a :class:`Topic` or a valid name), not looked up."""
    return topic.name if isinstance(topic, Topic) else validate_topic_name(topic)


def topic_name(topic: object, *, cached: bool = True) -> str:
    """Validate a topic reference and return its name; raise if it is not registered.

    ``cached``: a topic in :data:`known_topics` is taken as registered without a query.
    """
    name = name_of(topic)
    if cached and name in known_topics:
        return name
    found = Topic.objects.using(db.alias()).filter(name=name).values_list(*LIMIT_FIELDS).first()
    if found is not None:
        known_topics.add(name, found)
        return name
    registered = list(Topic.objects.using(db.alias()).values_list("name", flat=True)[:50])
    raise UnknownTopicError(
        f"Topic {name!r} is not registered. Registered topics: "
        f"{', '.join(map(repr, registered)) or 'none'}. "
        f"Register it with queue.register_topic({name!r})."
    )


def adding_tasks[T](topic: TopicRef, add: Callable[[], T]) -> T:
    """Call ``add()``, which inserts tasks of ``topic`` (``store.insert.push``); return its result.

    Raises :class:`UnknownTopicError` if the topic is not registered, also when
    :data:`known_topics` still holds it after it was deleted (the tables flushed by a
    test, the topic deleted by another process): the stale entry is healed on this
    call and never surfaces as an ``IntegrityError``. The cache spares the existence
    query wherever the insert itself shows a missing topic as an error this call
    catches: in autocommit (the insert's own commit checks the foreign key), on
    PostgreSQL (the insert checks its topic in the same statement,
    :func:`~django_tasks_coord.db.checks_topic_in_insert`) and on MySQL/MariaDB
    (foreign keys checked per statement). Inside the caller's transaction on SQLite the
    violation would only show at the caller's commit, so there the topic is looked up
    in that transaction, before the insert.
    """
    conn = db.connection()
    catchable = (
        conn.get_autocommit()
        or not conn.features.can_defer_constraint_checks
        or db.checks_topic_in_insert(conn)
    )
    name = topic_name(topic, cached=catchable)
    try:
        return add()
    except IntegrityError:
        known_topics.discard(name)
        topic_name(name)  # a deleted topic: UnknownTopicError instead
        raise


def registering[T](name: str, add: Callable[[], T]) -> T:
    """Call ``add()``, which adds tasks to topic ``name``, registering the topic as needed.

    For callers that make their topics on first use (``django.tasks`` queues, task
    definitions): the topic is registered before if this process has not seen it, and
    again if ``add`` finds it gone (:class:`UnknownTopicError` from
    :func:`adding_tasks`: the tables were flushed, or another process deleted it).
    """
    if name not in known_topics:
        register_topic(name)
    try:
        return add()
    except UnknownTopicError:
        register_topic(name)
        return add()


def register_topic(name: str) -> Topic:
    """Register a topic (idempotent) and return it. Tasks can only use registered topics.

    On PostgreSQL with a partitioned task table, the topic's partition is made first
    (:func:`~django_tasks_coord.partitions.ensure_partition`), before the topic's row:
    attaching a partition locks the topic table against writes (for the partition's
    foreign key), and doing it while this transaction already holds a new topic row
    would deadlock with another process registering another topic at the same time.

    Names starting with :data:`RESERVED_PREFIX` (``tasks_coord.``) are this package's own
    topics: :class:`~django_tasks_coord.exceptions.ReservedTopicError`.
    """
    name = validate_topic_name(name)
    if name.startswith(RESERVED_PREFIX):
        raise ReservedTopicError(
            f"Topic {name!r} starts with {RESERVED_PREFIX!r}, which is reserved for "
            "django-tasks-coord's own topics (jobs, coordination groups); choose another name."
        )
    return register_internal_topic(name)


def register_internal_topic(name: str) -> Topic:
    """Register one of this package's own topics (``tasks_coord.jobs``, group topics...).

    :func:`register_topic` without the reserved-prefix refusal; not for applications.
    """
    name = validate_topic_name(name)
    partitions.ensure_partition(name)
    topic, _ = Topic.objects.using(db.alias()).get_or_create(name=name)
    known_topics.add(name, tuple(getattr(topic, field) for field in LIMIT_FIELDS))
    return topic


#: The prefix of the announcement that a topic was resumed (the payload: prefix + topic).
RESUMED = "tasks_coord.resumed:"


def _set_paused(topic: str | Topic, paused: bool) -> bool:
    rows = Topic.objects.using(db.alias()).filter(name=topic_name(topic), paused=not paused)
    return rows.update(paused=paused) == 1


def pause_topic(topic: str | Topic) -> bool:
    """Pause a topic: no node claims its tasks (within one poll interval). True if it was running."""
    return _set_paused(topic, True)


def resume_topic(topic: str | Topic) -> bool:
    """Resume a paused topic. True if it was paused.

    The resumption is announced (``NOTIFY`` on PostgreSQL, and to the nodes of this
    process elsewhere): nodes that were told re-read their topics at once.
    """
    resumed = _set_paused(topic, False)
    if resumed:
        db.notify(db.connection(), RESUMED + topic_name(topic))
    return resumed


def record_outcomes(topic: str, *, failures: int = 0, successes: int = 0) -> None:
    """Keep ``Topic.consecutive_failures``: a success resets it, then each final failure adds one.

    Called by nodes after each completion batch, in completion order: ``successes``
    came before ``failures`` when both are given.
    """
    topics = Topic.objects.using(db.alias()).filter(name=topic)
    if successes:
        topics.filter(consecutive_failures__gt=0).update(consecutive_failures=0)
    if failures:
        topics.update(consecutive_failures=F("consecutive_failures") + failures)
