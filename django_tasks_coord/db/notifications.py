"""Announcing new or newly due work: ``NOTIFY`` on PostgreSQL, this process's listeners elsewhere.

What listens for it: :mod:`~django_tasks_coord.db.listen` (the node's wake-ups and the
long-polls of the HTTP API).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_tasks_coord.db.vendor import has_notify

#: The PostgreSQL channel on which new or newly due work is announced; the payload is the topic.
NOTIFY_CHANNEL = "tasks_coord"


_local_listeners: list[Callable[[str], None]] = []
_local_lock = threading.Lock()


def add_local_listener(wake: Callable[[str], None]) -> None:
    """Have :func:`notify` call ``wake(topic)`` in this process where there is no ``NOTIFY``."""
    with _local_lock:
        _local_listeners.append(wake)


def remove_local_listener(wake: Callable[[str], None]) -> None:
    """Undo :func:`add_local_listener` (nothing if ``wake`` was not added)."""
    with _local_lock:
        if wake in _local_listeners:
            _local_listeners.remove(wake)


def _wake_local(topic: str) -> None:
    with _local_lock:
        listeners = list(_local_listeners)
    for wake in listeners:
        wake(topic)


def notify(conn: BaseDatabaseWrapper, topic: str) -> None:
    """Wake sleeping nodes on PostgreSQL: ``NOTIFY`` travels with the transaction.

    PostgreSQL delivers the notification when (and only if) the surrounding
    transaction commits, so a node never wakes for a push that was rolled back.
    Other databases have no such channel; their nodes poll, except that the nodes of
    this very process (:func:`add_local_listener`) are woken when the transaction
    commits, like by a ``NOTIFY``.
    """
    if has_notify(conn):
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, topic])
    elif _local_listeners:
        transaction.on_commit(lambda: _wake_local(topic), using=conn.alias)
