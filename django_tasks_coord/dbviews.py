"""The ``task_pretty`` database view: the task table for people reading it by hand.

Every column of the task table, with ``state`` as its name (``'pending'``,
``'failed'``...) instead of its ordinal, ``topic`` for ``topic_id`` and ``owner`` as the
owner's name::

    SELECT sequence, topic, identifier, state, finished_at
    FROM task_pretty WHERE state = 'failed' ORDER BY sequence DESC LIMIT 20;

Migration ``0010`` creates it; ``migrate`` drops it before it runs migrations and
creates it again afterwards (so a migration that changes the task table never trips
over it, and the view always lists the table's current columns). Turn it off with
``TASKS_COORD["TASK_PRETTY_VIEW"] = False``; the next ``migrate`` drops it.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_tasks_coord.conf import app_settings
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task

#: The view's name.
VIEW = "task_pretty"


def wanted() -> bool:
    """Whether the view should exist (``TASK_PRETTY_VIEW``)."""
    return bool(app_settings.TASK_PRETTY_VIEW)


def exists(connection: BaseDatabaseWrapper) -> bool:
    """Whether the view exists on ``connection``."""
    with connection.cursor() as cursor:
        return VIEW in connection.introspection.table_names(cursor, include_views=True)


def definition(connection: BaseDatabaseWrapper) -> str:
    """The ``SELECT`` the view is made of, over the task table's current columns."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        columns = [
            column.name
            for column in connection.introspection.get_table_description(
                cursor, Task._meta.db_table
            )
        ]
    states = " ".join(f"WHEN {state.value} THEN '{state.name.lower()}'" for state in TaskState)
    renamed = {
        "state": f"CASE t.{quote('state')} {states} END",
        "topic_id": f"t.{quote('topic_id')}",
        "owner_id": f"o.{quote('name')}",
    }
    names = {"topic_id": "topic", "owner_id": "owner"}
    select = ", ".join(
        f"{renamed.get(column, f't.{quote(column)}')} AS {quote(names.get(column, column))}"
        for column in columns
    )
    return (
        f"SELECT {select} FROM {quote(Task._meta.db_table)} t "
        f"LEFT JOIN {quote(Owner._meta.db_table)} o ON o.{quote('id')} = t.{quote('owner_id')}"
    )


def create(connection: BaseDatabaseWrapper) -> None:
    """Create (or re-create) the view."""
    drop(connection)
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE VIEW {connection.ops.quote_name(VIEW)} AS {definition(connection)}")


def drop(connection: BaseDatabaseWrapper) -> None:
    """Drop the view if it exists."""
    with connection.cursor() as cursor:
        cursor.execute(f"DROP VIEW IF EXISTS {connection.ops.quote_name(VIEW)}")


def _task_table_exists(connection: BaseDatabaseWrapper) -> bool:
    with connection.cursor() as cursor:
        return Task._meta.db_table in connection.introspection.table_names(cursor)


def before_migrate(*, using: str, plan: Any = None, **kwargs: Any) -> None:
    """``pre_migrate``: drop the view so that migrations may change the task table freely."""
    connection = connections[using]
    if plan and exists(connection):
        drop(connection)


def after_migrate(*, using: str, **kwargs: Any) -> None:
    """``post_migrate``: create the view if wanted (and missing), drop it if not wanted."""
    connection = connections[using]
    if not _task_table_exists(connection):
        return
    present = exists(connection)
    if wanted() and not present:
        create(connection)
    elif not wanted() and present:
        drop(connection)
