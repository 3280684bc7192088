"""Announcing new or newly due work: ``NOTIFY`` on PostgreSQL, this process's listeners elsewhere.

Work is announced once it is committed, never before and never for a rollback: inside a
transaction, :func:`announce` collects the topics and sends one wake-up per topic when the
outermost transaction commits (``transaction.on_commit``); in autocommit it sends at once.

On PostgreSQL the wake-up is a statement of its own, after the commit of the work,
rather than a ``NOTIFY`` inside the transaction that wrote it: PostgreSQL serializes the
commits of transactions that notify (a global lock taken before the commit record is
flushed, held until it is), so ``NOTIFY`` inside the writers' transactions makes
concurrent producers commit one at a time, one disk flush each. Measured
(``benchmarks/results/enqueue_producers.md``, one run on a shared 2-core machine where no
variant scaled from 1 to 8 producers): 1.64x fewer pushes per second with the ``NOTIFY``
inside the insert's transaction with 8 producers, 1.44x with one. The wake-up's own
transaction commits without waiting for the flush (``synchronous_commit`` off: nothing in
it needs to survive a crash), so it holds that lock for microseconds. In autocommit, the insert and its wake-up
still travel in one round trip (:func:`with_wake`): one query string of the insert, a
``COMMIT`` and the wake-up, which PostgreSQL runs as two transactions, the insert's
committed (and flushed) before the wake-up's begins; elsewhere (server-side binding, which
takes one statement per query) the wake-up is a round trip of its own. A process that
dies between the two commits leaves the work to the nodes' next poll.

What listens for it: :mod:`~django_tasks_coord.db.listen` (the node's wake-ups and the
long-polls of the HTTP API).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_tasks_coord.db.reconnect import connection_lost
from django_tasks_coord.db.vendor import has_notify

logger = logging.getLogger(__name__)

#: The PostgreSQL channel on which new or newly due work is announced; the payload is the topic.
NOTIFY_CHANNEL = "tasks_coord"

#: Above this share of PostgreSQL's notification queue in use (a listener has not read
#: for a long time), wake-ups are skipped rather than fail: the nodes still poll.
QUEUE_USAGE_LIMIT = 0.5

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


def wakes_by_notify(conn: BaseDatabaseWrapper) -> bool:
    """Whether wake-ups on ``conn`` are ``NOTIFY`` statements (PostgreSQL)."""
    return has_notify(conn)


def wake_statement(topics: Iterable[str]) -> tuple[str, list[str]]:
    """PostgreSQL: the statement (and its parameters) that wakes the listeners of ``topics``.

    Run in autocommit, after the commit of the work it announces: a transaction of its
    own, which commits without waiting for the disk (``synchronous_commit`` off, local
    to it). It cannot fail for a full notification queue: above
    :data:`QUEUE_USAGE_LIMIT` it sends nothing.
    """
    names = sorted(set(topics))
    calls = ", ".join("pg_notify(%s, %s)" for _ in names)
    sql = (
        f"SELECT set_config('synchronous_commit', 'off', true), {calls} "
        f"WHERE pg_notification_queue_usage() < {QUEUE_USAGE_LIMIT}"
    )
    return sql, [value for name in names for value in (NOTIFY_CHANNEL, name)]


def wakes_with_statement(conn: BaseDatabaseWrapper) -> bool:
    """Whether an autocommitted statement on ``conn`` can carry its wake-up (:func:`with_wake`).

    PostgreSQL with client-side binding (Django's default): the query string goes as one
    simple query, which may hold several statements. Not with
    ``OPTIONS["server_side_binding"]`` (a prepared statement is one statement), nor inside
    a transaction (the wake-up waits for its commit there, :func:`announce`).
    """
    return (
        wakes_by_notify(conn)
        and conn.get_autocommit()
        and conn.settings_dict.get("OPTIONS", {}).get("server_side_binding") is not True
    )


def with_wake(sql: str, params: list[Any], topics: Iterable[str]) -> tuple[str, list[Any]]:
    """``sql`` (one autocommitted statement whose rows the caller reads) followed by its
    ``COMMIT`` and the wake-up of ``topics`` (:func:`wake_statement`), as one query string.

    PostgreSQL runs the statements of one simple query as one implicit transaction up to
    the ``COMMIT``, then the wake-up as a transaction of its own: ``sql`` is committed
    (flushed to disk) without the lock that notifying transactions take at commit, and
    the wake-up is sent only if ``sql`` succeeded (an error skips the rest of the query).
    The cursor's current result stays ``sql``'s. Only where :func:`wakes_with_statement`.
    """
    wake_sql, wake_params = wake_statement(topics)
    return f"{sql}; COMMIT; {wake_sql}", [*params, *wake_params]


def wake(conn: BaseDatabaseWrapper, topics: Iterable[str]) -> None:
    """Wake the listeners of ``topics`` now, for work already committed.

    PostgreSQL: :func:`wake_statement` (a failure is logged, not raised: the work is
    committed and the nodes find it when they next poll). Elsewhere: this process's
    local listeners.
    """
    names = sorted(set(topics))
    if not names:
        return
    if not wakes_by_notify(conn):
        for name in names:
            _wake_local(name)
        return
    sql, params = wake_statement(names)
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
    except DatabaseError as exc:  # a lost connection is an outage the node reports once
        logger.log(
            logging.DEBUG if connection_lost(exc) else logging.WARNING,
            "Could not wake the nodes of %s (%s); they will poll.",
            names,
            exc,
        )


class _Wake:
    """The ``on_commit`` callback of one transaction: wakes its topics once, after the commit."""

    def __init__(self, conn: BaseDatabaseWrapper) -> None:
        self.conn = conn
        self.topics: set[str] = set()

    def __call__(self) -> None:
        wake(self.conn, self.topics)


#: Per thread and alias: where the last :class:`_Wake` sits among the ``on_commit`` callbacks.
_last = threading.local()


def _pending(conn: BaseDatabaseWrapper) -> _Wake:
    """The :class:`_Wake` of ``conn``'s open transaction, registered on first use.

    Looked up among the transaction's ``on_commit`` callbacks (where this thread last
    saw it first), so that a callback that a rolled-back savepoint discarded is never
    reused: topics announced after that get a new one. A topic added inside a savepoint
    that is later rolled back stays in the callback (a node wakes and finds nothing),
    which is harmless.
    """
    callbacks: list[Any] = conn.run_on_commit
    seen = getattr(_last, conn.alias, None)
    if seen is not None:
        index, pending = seen
        if index < len(callbacks) and callbacks[index][1] is pending:
            return pending  # type: ignore[no-any-return]
    for index in range(len(callbacks) - 1, -1, -1):
        if isinstance(callbacks[index][1], _Wake) and callbacks[index][1].conn is conn:
            setattr(_last, conn.alias, (index, callbacks[index][1]))
            return callbacks[index][1]  # type: ignore[no-any-return]
    pending = _Wake(conn)
    transaction.on_commit(pending, using=conn.alias, robust=True)
    setattr(_last, conn.alias, (len(conn.run_on_commit) - 1, pending))
    return pending


def announce(conn: BaseDatabaseWrapper, topics: Iterable[str]) -> None:
    """Wake the nodes of ``topics`` once the work just written on ``conn`` is committed.

    Inside a transaction, when the outermost one commits (one wake-up per topic and
    transaction, none if it rolls back); in autocommit, at once. Under manual transaction
    management (autocommit off, no atomic block), PostgreSQL's ``NOTIFY`` is sent in the
    transaction, which delivers it at commit; elsewhere nothing is sent (the nodes poll).
    """
    if conn.in_atomic_block:
        _pending(conn).topics.update(topics)
    elif conn.get_autocommit():
        wake(conn, topics)
    elif wakes_by_notify(conn):
        with conn.cursor() as cursor:
            for name in sorted(set(topics)):
                cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, name])


def notify(conn: BaseDatabaseWrapper, topic: str) -> None:
    """Wake sleeping nodes for ``topic`` once the current transaction commits (:func:`announce`).

    A node never wakes for work that was rolled back. On PostgreSQL the wake-up is a
    ``NOTIFY`` that reaches every process listening; elsewhere only the nodes of this
    very process (:func:`add_local_listener`) are woken, the others poll.
    """
    announce(conn, [topic])
