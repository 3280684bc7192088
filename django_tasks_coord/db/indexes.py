"""Index helpers, named for what they index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.backends.ddl_references import Columns, Statement, Table


class PartialStateIndex(models.Index):
    """An index over the rows in some states only, as narrow as each database allows.

    Which states: ``state_value`` (one ordinal, for instance the queue's waiting rows,
    PENDING), ``states`` (a set of ordinals) or ``state_below`` (every state under an
    ordinal); exactly one of them. PostgreSQL and SQLite get a partial index
    (``WHERE state = ...``): it holds only those rows, so its size and the cost of a
    lookup do not grow with history, and the planner cannot mistake it for an index
    over every row. MySQL/MariaDB have no partial indexes; there ``fallback_fields`` is
    indexed, by default the fields with ``state`` put after the leading one, which
    keeps the lookup a range scan of the same rows. (A plain ``Index(condition=...)``
    is silently *not created* on MySQL.) ``fallback_columns`` instead names the columns
    to index there by their database names: for a generated column a migration adds
    on MySQL/MariaDB only, which the model does not declare (see
    :data:`django_tasks_coord.models.UNFINISHED_IDENTIFIER`).

    Migrations written before it had this name call it ``PendingIndex``
    (:data:`PendingIndex`, the same class); it deconstructs to
    ``django_tasks_coord.db.PartialStateIndex``.
    """

    def __init__(
        self,
        *,
        fields: list[str],
        name: str,
        state_value: int | None = None,
        states: Sequence[int] | None = None,
        state_below: int | None = None,
        fallback_fields: Sequence[str] | None = None,
        fallback_columns: Sequence[str] | None = None,
    ) -> None:
        super().__init__(fields=fields, name=name)
        if sum(x is not None for x in (state_value, states, state_below)) != 1:
            raise ValueError("Give exactly one of state_value, states and state_below.")
        if fallback_fields is not None and fallback_columns is not None:
            raise ValueError("Give at most one of fallback_fields and fallback_columns.")
        self.state_value = state_value
        self.states = tuple(states) if states is not None else None
        self.state_below = state_below
        self.fallback_fields = list(fallback_fields) if fallback_fields is not None else None
        self.fallback_columns = list(fallback_columns) if fallback_columns is not None else None

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        _, args, kwargs = super().deconstruct()
        for key in ("state_value", "states", "state_below", "fallback_fields", "fallback_columns"):
            if (value := getattr(self, key)) is not None:
                kwargs[key] = list(value) if isinstance(value, tuple) else value
        return "django_tasks_coord.db.PartialStateIndex", args, kwargs

    def _condition(self) -> models.Q:
        if self.states is not None:
            return models.Q(state__in=self.states)
        if self.state_below is not None:
            return models.Q(state__lt=self.state_below)
        return models.Q(state=self.state_value)

    def _concrete(self, conn: BaseDatabaseWrapper) -> models.Index:
        if conn.features.supports_partial_indexes:
            return models.Index(fields=self.fields, name=self.name, condition=self._condition())
        fields = self.fallback_fields or [self.fields[0], "state", *self.fields[1:]]
        return models.Index(fields=fields, name=self.name)

    def create_sql(
        self,
        model: type[models.Model],
        schema_editor: BaseDatabaseSchemaEditor,
        using: str = "",
        **kwargs: Any,
    ) -> Statement:
        if self.fallback_columns and not schema_editor.connection.features.supports_partial_indexes:
            table, quote = model._meta.db_table, schema_editor.quote_name
            return Statement(
                "CREATE INDEX %(name)s ON %(table)s (%(columns)s)",
                name=quote(self.name),
                table=Table(table, quote),
                columns=Columns(table, self.fallback_columns, quote),
            )
        return self._concrete(schema_editor.connection).create_sql(
            model, schema_editor, using=using, **kwargs
        )


#: The name :class:`PartialStateIndex` had when it served only the queue's waiting rows;
#: migrations 0001, 0002, 0005 and 0011 use it.
PendingIndex = PartialStateIndex
