"""The app's database alias, its write transactions and row locks.

Every transaction of this package that writes starts with :func:`write_transaction`;
every claim locks its rows with :func:`lock_kwargs`. What differs between databases is
decided here (and in :mod:`~django_tasks_coord.db.vendor`), not by the callers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db import connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Now

from django_tasks_coord.conf import app_settings
from django_tasks_coord.db.vendor import locks_whole_database


def alias() -> str:
    """The database alias holding the app's tables (``TASKS_COORD["DATABASE"]``)."""
    return str(app_settings.DATABASE)


def connection() -> BaseDatabaseWrapper:
    """The connection for :func:`alias`."""
    return connections[alias()]


def lock_kwargs(conn: BaseDatabaseWrapper, *, skip_locked: bool = True) -> dict[str, Any]:
    """Arguments for ``select_for_update`` on the task table (``skip_locked`` for claims).

    PostgreSQL and MySQL/MariaDB lock the claimed rows and skip rows another
    claimer holds (``SKIP LOCKED``). ``OF`` restricts the lock to the task table on
    backends that support it (PostgreSQL, MySQL 8), so subqueries of a poll
    condition lock nothing. SQLite ignores ``select_for_update``; claims there are
    serialized by :func:`serialize_claims` instead.
    """
    features = conn.features
    kwargs: dict[str, Any] = {
        "skip_locked": skip_locked and features.has_select_for_update_skip_locked
    }
    if features.has_select_for_update_of:
        kwargs["of"] = ("self",)
    return kwargs


def serialize_claims(conn: BaseDatabaseWrapper) -> None:
    """Take SQLite's database write lock at the start of a claim transaction.

    SQLite has neither row locks nor ``SKIP LOCKED``. A deferred transaction that
    reads and then writes can fail at once with "database is locked" when another
    connection wrote in between (the busy timeout does not apply to lock upgrades).
    Writing first, like ``BEGIN IMMEDIATE``, makes concurrent claims wait their turn
    instead: an ``UPDATE`` of no row of the topic table (looked up in Django's app
    registry, so this module needs no import of the models). Call it as the first
    statement inside ``transaction.atomic``; a no-op on the other databases.
    """
    if not locks_whole_database(conn):
        return
    topic = apps.get_model("django_tasks_coord", "Topic")
    with conn.cursor() as cursor:
        table = conn.ops.quote_name(topic._meta.db_table)
        cursor.execute(f"UPDATE {table} SET paused = paused WHERE 1 = 0")


@contextmanager
def write_transaction() -> Iterator[None]:
    """``transaction.atomic`` on the app's alias that takes SQLite's write lock first.

    Every transaction of this package that writes starts this way: on SQLite a
    transaction that reads before it writes fails at once ("database is locked")
    when another process writes meanwhile; taking the lock first makes it wait for
    its turn instead (:func:`serialize_claims`). Elsewhere it is a plain atomic block.
    """
    with transaction.atomic(using=alias()):
        serialize_claims(connection())
        yield


def ago(delta: timedelta) -> models.Expression:
    """``NOW() - delta`` on the database clock (heartbeats are compared with it)."""
    return models.ExpressionWrapper(Now() - delta, output_field=models.DateTimeField())
