"""The task queryset (``Task.objects``): the read-side vocabulary of the task table, and
the lookup that reads an identifier's unfinished tasks the way each database indexes them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import EmptyResultSet
from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.expressions import Combinable
from django.db.models.functions import Now
from django.db.models.lookups import Exact, In
from django.db.models.sql.compiler import SQLCompiler

from django_tasks_coord import db
from django_tasks_coord.enums import COMPLETED_MAX, COMPLETED_MIN, IN_FLIGHT, TaskState
from django_tasks_coord.models.inserts import InsertStatement, insert_statements

if TYPE_CHECKING:
    from django_tasks_coord.models.tasks import Task, Topic


#: MySQL/MariaDB only: a virtual column of the task table (migration 0011), the task's
#: ``identifier`` while it is unfinished (state below :data:`COMPLETED_MIN`) and NULL
#: once it is finished. Those databases have no partial indexes; indexing this column
#: instead of ``(identifier, state)`` gives every finished task the same key, so
#: finishing a task moves its index entry to the end of its topic's range instead of
#: to the page of its identifier somewhere in the whole history.
UNFINISHED_IDENTIFIER = "unfinished_identifier"


class _UnfinishedIdentifier(models.Lookup):
    """``identifier`` compared only among unfinished tasks, the way each database indexes it.

    PostgreSQL and SQLite: ``(identifier = ... AND state < 40)``, served by the partial
    ``tasks_coord_unfinished`` index. MySQL/MariaDB: the virtual column
    :data:`UNFINISHED_IDENTIFIER` compared instead of ``identifier`` (its index is
    ``(topic_id, unfinished_identifier)``; MariaDB never rewrites an expression into a
    generated column on its own, so the query names it).
    """

    lhs: Any

    def _column(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, name: str) -> str:
        """Column ``name`` of the same table (alias) as ``identifier`` in this query."""
        identifier, _ = compiler.compile(self.lhs)
        qualifier = identifier.removesuffix(connection.ops.quote_name(self.lhs.target.column))
        return qualifier + connection.ops.quote_name(name)

    def process_lhs(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, lhs: Any = None
    ) -> tuple[str, Any]:
        if lhs is None and db.uses_virtual_columns(connection):
            return self._column(compiler, connection, UNFINISHED_IDENTIFIER), []
        return super().process_lhs(compiler, connection, lhs)

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> tuple[str, Any]:
        sql, params = super().as_sql(compiler, connection)
        state = self._column(compiler, connection, "state")
        return f"({sql} AND {state} < %s)", (*params, COMPLETED_MIN)

    def as_mysql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> tuple[str, Any]:
        return super().as_sql(compiler, connection)  # the column is NULL once finished


class _UnfinishedIdentifierExact(_UnfinishedIdentifier, Exact):
    pass


class _UnfinishedIdentifierIn(_UnfinishedIdentifier, In):
    pass


class _KeysIn(In):
    """``sequence IN (...)``, on PostgreSQL ``sequence = ANY(%s::bigint[])``: one parameter
    however many keys, so the statement's text stays the same and psycopg parses its
    placeholders once (the completer fences hundreds of rows per ``UPDATE``)."""

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper
    ) -> tuple[str, Any]:
        keys = [key for key in self.rhs if key is not None]
        if not keys:
            raise EmptyResultSet
        lhs, params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s::bigint[])", (*params, keys)


class TaskQuerySet(models.QuerySet["Task"]):
    """Read-side vocabulary for tasks, and :meth:`insert`, the data layer's insert that the
    task store (:mod:`django_tasks_coord.store`) calls; nothing else writes task rows."""

    def for_topic(self, topic: str | Topic) -> TaskQuerySet:
        """Tasks of one topic."""
        return self.filter(topic_id=topic if isinstance(topic, str) else topic.name)

    def pending(self) -> TaskQuerySet:
        """Tasks waiting to be polled (due or not)."""
        return self.filter(state=TaskState.PENDING)

    def due(self) -> TaskQuerySet:
        """Pending tasks whose ``execute_at`` is unset or not in the future (database clock)."""
        return self.pending().filter(
            models.Q(execute_at__isnull=True) | models.Q(execute_at__lte=Now())
        )

    def in_flight(self) -> TaskQuerySet:
        """Tasks held by an owner or an external executor."""
        return self.filter(state__in=IN_FLIGHT)

    def rows(self, tasks: Iterable[Task]) -> TaskQuerySet:
        """Exactly these tasks, by topic and sequence (on MySQL/MariaDB by sequence alone).

        The topic lets PostgreSQL look only into the partitions of those topics when the
        task table is partitioned (:mod:`django_tasks_coord.partitions`).
        """
        tasks = list(tasks)
        keys = [task.pk for task in tasks]
        if not db.topic_in_key_lookups(connections[self.db]):
            # One table there, so the topic buys nothing; worse, with it MySQL may walk an
            # index of the topic's rows instead of looking these up by key, and then wait on
            # a row another transaction holds (one SKIP LOCKED left out of ``tasks``).
            return self.filter(pk__in=keys)
        topics = {task.topic_id for task in tasks}
        return self.filter(_KeysIn(models.F("pk"), keys), topic_id__in=topics)

    def completed(self) -> TaskQuerySet:
        """Tasks in any completed state (one range of ordinals)."""
        return self.filter(state__gte=COMPLETED_MIN, state__lte=COMPLETED_MAX)

    def not_completed(self) -> TaskQuerySet:
        """Tasks that are pending or in flight."""
        return self.filter(state__lt=COMPLETED_MIN)

    def unfinished_of(self, identifier: str | Iterable[str] | Combinable) -> TaskQuerySet:
        """Pending or in-flight tasks of ``identifier``: one, several, or an ``OuterRef``.

        Means ``filter(identifier=..., state__lt=COMPLETED_MIN)``, written the way the
        ``tasks_coord_unfinished`` index serves it on every database (on MySQL/MariaDB
        through the virtual column :data:`UNFINISHED_IDENTIFIER`). Lookups of an
        identifier's unfinished tasks on hot paths use this, so that their cost does not
        grow with the identifier's history.
        """
        if isinstance(identifier, (str, Combinable)):
            return self.filter(_UnfinishedIdentifierExact(models.F("identifier"), identifier))
        return self.filter(_UnfinishedIdentifierIn(models.F("identifier"), list(identifier)))

    def insert_statements(self, tasks: list[Task]) -> list[InsertStatement] | None:
        """The ``INSERT ... RETURNING`` statements of ``tasks``, for the task store to run.

        One per batch the database allows (one on PostgreSQL and MariaDB; SQLite caps the
        parameters of a statement); None where :meth:`insert` must write them (MySQL 8,
        which cannot return the rows of a multi-row insert). Only the task store
        (:mod:`django_tasks_coord.store.insert`) calls it.
        """
        return insert_statements(self.model, tasks, self.db)

    def insert(self, tasks: list[Task]) -> list[Task]:
        """Insert ``tasks`` and return them with their sequence and database-made fields.

        One statement where the backend returns the keys of a multi-row insert
        (PostgreSQL, MariaDB, SQLite); row by row on MySQL 8, which cannot. The task
        store runs :meth:`insert_statements` itself where it can, and this otherwise.
        """
        if not connections[self.db].features.can_return_rows_from_bulk_insert:
            for task in tasks:
                task.save(using=self.db, force_insert=True)
                task.refresh_from_db(using=self.db, fields=["created_at"])
            return tasks
        return self.bulk_create(tasks)
