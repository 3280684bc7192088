"""The ``INSERT ... RETURNING`` statements of new task rows, for the task store to run.

``bulk_create`` runs its statement itself; the task store needs the statement in hand,
to send it in one round trip with its commit and the nodes' wake-up (PostgreSQL), or
inside a statement that also checks the topic. :func:`insert_statements` builds what
``bulk_create`` would send (Django's insert compiler, the same fields, batches and
returned fields); :meth:`InsertStatement.read` sets what the database returned on the
tasks, as ``bulk_create`` does. Only :meth:`TaskQuerySet.insert_statements
<django_tasks_coord.models.TaskQuerySet.insert_statements>` calls it.

Compiling an insert costs more than sending it (tens of fields, each quoted and
prepared): the SQL of each shape (the database, which fields are left to their
database default, how many rows) is compiled once by Django and kept; each call only
prepares its values (``Field.get_db_prep_save``) in the layout Django's SQL takes them:
row after row, or on PostgreSQL one array per column (``UNNEST``) for several rows.

The task store's appends (rows that share all but a few values) have statements of their
own on PostgreSQL: :func:`from_arrays` (``UNNEST``, the shared values sent once) and, for
a single row, :func:`from_values` (``INSERT ... VALUES``).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import AutoField, DateField, Field
from django.db.models.expressions import DatabaseDefault
from django.db.models.sql import InsertQuery

if TYPE_CHECKING:
    from django_tasks_coord.models.tasks import Task

#: Compiled shapes kept (an entry per database, defaulted fields and row count).
MAX_SHAPES = 128

#: ``{position: (converters, expression)}``, as ``SQLCompiler.get_converters`` returns them.
Converters = dict[int, tuple[list[Callable[..., Any]], Any]]


@dataclasses.dataclass(frozen=True)
class _Shape:
    """The compiled SQL of one shape of insert, and how its parameters are laid out."""

    sql: str
    fields: tuple[Field[Any, Any], ...]  # the columns written, in the SQL's order
    by_column: bool  # one array parameter per column (PostgreSQL's UNNEST), else row by row
    converters: Converters  # for the returned columns


@dataclasses.dataclass
class InsertStatement:
    """One ``INSERT`` of some tasks, returning their sequence and database-made fields."""

    sql: str
    params: Sequence[Any]
    tasks: list[Task]
    using: str
    converters: Converters

    def read(self, rows: Iterable[Sequence[Any]]) -> None:
        """Set the returned ``rows`` (one per task, in order, as the database sent them)."""
        fields = self.tasks[0]._meta.db_returning_fields if self.tasks else []
        conn = connections[self.using]
        values = [list(row) for row in rows]
        if len(values) != len(self.tasks):
            raise DatabaseError(
                f"The insert of {len(self.tasks)} task(s) returned {len(values)} row(s)."
            )
        for task, row in zip(self.tasks, values, strict=True):
            for position, (converters, expression) in self.converters.items():
                for converter in converters:
                    row[position] = converter(row[position], expression, conn)
            for value, field in zip(row, fields, strict=True):
                setattr(task, field.attname, value)
            task._state.adding = False
            task._state.db = self.using


_shapes: OrderedDict[tuple[Any, ...], _Shape] = OrderedDict()
_shapes_lock = threading.Lock()


def insert_statements(
    model: type[Task], tasks: list[Task], using: str
) -> list[InsertStatement] | None:
    """The statements inserting ``tasks`` (one per batch the database allows), or None.

    None where ``bulk_create`` must do it: the database cannot return the rows of a
    multi-row insert (MySQL 8), or a task already has its sequence.
    """
    conn = connections[using]
    if not conn.features.can_return_rows_from_bulk_insert:
        return None
    for task in tasks:
        task._prepare_related_fields_for_save(operation_name="bulk_create")  # type: ignore[attr-defined]
        if task.pk is not None:
            return None
    columns = _columns(model)
    size = max(conn.ops.bulk_batch_size([c.field for c in columns], tasks), 1)
    return [
        _statement(model, conn, tasks[start : start + size], columns)
        for start in range(0, len(tasks), size)
    ]


class _Column(NamedTuple):
    """A field an insert may write, with what :func:`_statement` asks of it on every call."""

    field: Field[Any, Any]
    attname: str
    pre_save: bool  # its pre_save() can differ from reading the attribute (auto_now...)
    db_default: bool  # left to the database when a row holds DatabaseDefault
    null_default: bool  # nullable without a database default: NULL when not written


@functools.cache
def _columns(model: type[Task]) -> list[_Column]:
    """The fields an insert writes, as ``bulk_create`` picks them (no sequence, no generated)."""
    columns = []
    for field in model._meta.concrete_fields:
        if field.generated or isinstance(field, AutoField):
            continue
        if isinstance(field, DateField):
            pre_save = bool(field.auto_now or field.auto_now_add)
        else:
            pre_save = type(field).pre_save is not Field.pre_save
        db_default = field.has_db_default()
        columns.append(
            _Column(field, field.attname, pre_save, db_default, field.null and not db_default)
        )
    return columns


def _statement(
    model: type[Task], conn: BaseDatabaseWrapper, batch: list[Task], columns: list[_Column]
) -> InsertStatement:
    """The statement of one batch: its shape's SQL (compiled on first use), its values.

    Columns that every row leaves to the database are not written: a database default
    (``db_default``), or NULL in a nullable column without one (NULL either way).
    """
    values = [
        [c.field.pre_save(task, True) if c.pre_save else getattr(task, c.attname) for c in columns]
        for task in batch
    ]
    written = []
    for index, column in enumerate(columns):
        if column.db_default:
            defaults = sum(isinstance(row[index], DatabaseDefault) for row in values)
            if defaults == len(batch):
                continue
            if defaults:  # some rows take the default, some not: Django compiles it
                return _compiled(model, conn, batch, [c.field for c in columns])[0]
        elif column.null_default and all(row[index] is None for row in values):
            continue
        written.append(index)
    key = (conn.alias, type(conn), tuple(written), len(batch))
    shape = _shapes.get(key)
    if shape is None:
        statement, shape = _compiled(model, conn, batch, [columns[i].field for i in written])
        if shape is not None:
            with _shapes_lock:
                _shapes[key] = shape
                while len(_shapes) > MAX_SHAPES:
                    _shapes.popitem(last=False)
        return statement
    fields = [columns[i].field for i in written]
    rows = [
        [_prepared(field, row[i], conn) for field, i in zip(fields, written, strict=True)]
        for row in values
    ]
    params = (
        [list(column) for column in zip(*rows, strict=True)]
        if shape.by_column
        else [value for row in rows for value in row]
    )
    return InsertStatement(shape.sql, params, batch, conn.alias, shape.converters)


def from_arrays(
    model: type[Task],
    template: Task,
    varying: Sequence[str],
    returning: Sequence[str],
    using: str,
    *,
    merged: Sequence[str] = (),
) -> tuple[str, list[Any]]:
    """PostgreSQL: ``INSERT ... SELECT ... FROM UNNEST(...)`` of rows that are all ``template``
    but for their ``varying`` fields; the SQL (kept per shape) and its shared parameters.

    The caller appends one array per varying field, in that order, to the parameters; the
    statement returns the ``returning`` fields' raw values, one row per array element, in
    the arrays' order. The template's shared values are sent once. Columns it leaves to
    the database (a ``db_default``; NULL in a nullable column) are not written. A
    ``merged`` field (JSON, varying too) is the template's object with each row's keys
    merged in (``||``): what all rows share is sent once.
    """
    return _from_template(model, template, varying, returning, using, merged, _unnest_sql)


def from_values(
    model: type[Task],
    template: Task,
    varying: Sequence[str],
    returning: Sequence[str],
    using: str,
) -> tuple[str, list[Any]]:
    """PostgreSQL: the one row of :func:`from_arrays` as ``INSERT ... VALUES``, which the
    server runs faster than an ``UNNEST`` of one-element arrays.

    The caller appends one value per varying field, in that order, to the parameters (a
    JSON field's as its JSON text); the statement writes the same columns as
    :func:`from_arrays` would, and returns the ``returning`` fields' raw values. There is
    nothing to share with other rows: a caller merges a JSON field's values itself.
    """
    return _from_template(model, template, varying, returning, using, (), _values_sql)


#: Builds the SQL of :func:`_from_template`: (model, connection, the written columns, the
#: varying fields, the returning fields, the merged fields).
_Builder = Callable[
    [type["Task"], BaseDatabaseWrapper, list[_Column], Sequence[str], Sequence[str], Sequence[str]],
    str,
]


def _from_template(
    model: type[Task],
    template: Task,
    varying: Sequence[str],
    returning: Sequence[str],
    using: str,
    merged: Sequence[str],
    build: _Builder,
) -> tuple[str, list[Any]]:
    """The SQL ``build`` makes of the columns written for rows that are all ``template`` but
    for their ``varying`` fields (kept per shape and builder), and the parameters that the
    rows share: the template's values of the written columns that do not vary (and of the
    ``merged`` ones), in the columns' order."""
    conn = connections[using]
    columns = _columns(model)
    values = {
        c.attname: c.field.pre_save(template, True) if c.pre_save else getattr(template, c.attname)
        for c in columns
    }
    written = [
        c
        for c in columns
        if c.attname in varying
        or c.attname in merged
        or not (
            isinstance(values[c.attname], DatabaseDefault)
            or (c.null_default and values[c.attname] is None)
        )
    ]
    key = (
        build.__name__,
        conn.alias,
        type(conn),
        tuple(c.attname for c in written),
        *varying,
        "merged",
        *merged,
        "returning",
        *returning,
    )
    sql = _template_sql.get(key)
    if sql is None:
        sql = _template_sql[key] = build(model, conn, written, varying, returning, merged)
    shared = [
        _prepared(c.field, values[c.attname], conn)
        for c in written
        if c.attname not in varying or c.attname in merged
    ]
    return sql, shared


_template_sql: dict[tuple[Any, ...], str] = {}


def _cast_types(
    conn: BaseDatabaseWrapper, written: list[_Column], varying: Sequence[str]
) -> list[str]:
    """The varying fields' database types without their modifiers (varchar, not
    varchar(255)), as Django's ``UNNEST`` casts its arrays: their parameters' casts."""
    by_name = {c.attname: c.field for c in written}
    return [str(by_name[name].db_type(conn)).split("(")[0] for name in varying]


def _returning_sql(model: type[Task], conn: BaseDatabaseWrapper, returning: Sequence[str]) -> str:
    """The columns of the ``returning`` fields, quoted, for a ``RETURNING`` clause."""
    quote = conn.ops.quote_name
    return ", ".join(quote(str(model._meta.get_field(name).column)) for name in returning)  # type: ignore[union-attr]


def _values_sql(
    model: type[Task],
    conn: BaseDatabaseWrapper,
    written: list[_Column],
    varying: Sequence[str],
    returning: Sequence[str],
    merged: Sequence[str],
) -> str:
    """``INSERT ... VALUES`` of one row: the shared columns first, then the varying ones in
    their order (so that the parameters are the shared ones, then one per varying field)."""
    quote = conn.ops.quote_name
    shared = [c for c in written if c.attname not in varying]
    by_name = {c.attname: c for c in written}
    columns = ", ".join(
        quote(str(c.field.column)) for c in [*shared, *(by_name[name] for name in varying)]
    )
    values = ", ".join(
        ["%s"] * len(shared) + [f"%s::{type_}" for type_ in _cast_types(conn, written, varying)]
    )
    return (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES ({values}) "
        f"RETURNING {_returning_sql(model, conn, returning)}"
    )


def _unnest_sql(
    model: type[Task],
    conn: BaseDatabaseWrapper,
    written: list[_Column],
    varying: Sequence[str],
    returning: Sequence[str],
    merged: Sequence[str],
) -> str:
    quote = conn.ops.quote_name
    types = _cast_types(conn, written, varying)
    arrays = ", ".join(f"%s::{type_}[]" for type_ in types)
    values = ", ".join(
        f"(%s::{types[list(varying).index(c.attname)]} || arrays.{quote(c.attname)})"
        if c.attname in merged
        else f"arrays.{quote(c.attname)}"
        if c.attname in varying
        else "%s"
        for c in written
    )
    columns = ", ".join(quote(str(c.field.column)) for c in written)
    aliases = ", ".join(quote(name) for name in varying)
    return (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) SELECT {values} "
        f"FROM UNNEST({arrays}) AS arrays({aliases}) RETURNING "
        f"{_returning_sql(model, conn, returning)}"
    )


def _prepared(field: Field[Any, Any], value: Any, conn: BaseDatabaseWrapper) -> Any:
    """``value`` as Django's insert compiler sends it (``get_db_prep_save``; None stays None)."""
    return None if value is None else field.get_db_prep_save(value, connection=conn)


def _compiled(
    model: type[Task], conn: BaseDatabaseWrapper, batch: list[Task], fields: list[Field[Any, Any]]
) -> tuple[InsertStatement, _Shape | None]:
    """The statement of ``batch`` as Django compiles it, and its shape if it has one.

    A shape is kept only when Django's parameters are the written fields' values in one
    of the two layouts (nothing but plain ``%s`` placeholders), so that later calls can
    lay out theirs the same way.
    """
    opts = model._meta
    query = InsertQuery(model)
    rows: list[Any] = batch  # InsertQuery is typed for Model; a Task is one
    query.insert_values(fields, rows)
    compiler = query.get_compiler(connection=conn)
    compiler.returning_fields = opts.db_returning_fields
    ((sql, params),) = compiler.as_sql()
    columns = [field.get_col(opts.db_table) for field in opts.db_returning_fields]
    converters: Converters = compiler.get_converters(columns)
    statement = InsertStatement(sql, params, batch, conn.alias, converters)
    written = tuple(
        field
        for field in fields
        if not all(isinstance(getattr(task, field.attname), DatabaseDefault) for task in batch)
    )
    expected = [[_prepared(f, f.pre_save(task, True), conn) for f in written] for task in batch]
    by_row = [value for row in expected for value in row]
    by_column = [list(column) for column in zip(*expected, strict=True)]
    if len(batch) > 1 and _same(params, by_column, nested=True):
        return statement, _Shape(sql, written, True, converters)
    if _same(params, by_row, nested=False):
        return statement, _Shape(sql, written, False, converters)
    return statement, None


_PLAIN = (str, int, float, bool, type(None))


def _same(params: Sequence[Any], values: list[Any], *, nested: bool) -> bool:
    """Whether Django's ``params`` are ``values``: the same length and types, equal where plain.

    (Adapted values, such as psycopg's ``Jsonb``, compare by type only.)
    """
    if len(params) != len(values):
        return False
    for param, value in zip(params, values, strict=True):
        if nested:
            if not isinstance(param, list) or not _same(param, value, nested=False):
                return False
        elif type(param) is not type(value) or (isinstance(value, _PLAIN) and param != value):
            return False
    return True
