"""PostgreSQL's catalog: what a table is made of, to rebuild it under another shape.

:func:`django_tasks_coord.partitions.convert` reads the task table with
:func:`read_schema` and recreates every column, key, index and foreign key on the new
table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TableSchema", "read_schema"]


@dataclass
class TableSchema:
    """What a table is made of, read from the catalog."""

    columns: list[str]
    primary_key: str
    indexes: dict[str, str]  # name -> CREATE INDEX statement (not backing a constraint)
    unique: dict[str, str]  # constraint name -> definition (UNIQUE (...)), primary key excluded
    foreign: dict[str, str]  # constraint name -> definition (FOREIGN KEY ...)


def read_schema(cursor: object, name: str) -> TableSchema:
    """What the table ``name`` is made of (one query per kind of object)."""
    execute = cursor.execute  # type: ignore[attr-defined]
    fetch = cursor.fetchall  # type: ignore[attr-defined]
    execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum",
        [name],
    )
    columns = [row[0] for row in fetch()]
    execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass(%s) "
        "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid "
        "AND k.conrelid = i.indrelid)",
        [name],
    )
    indexes = dict(fetch())
    execute(
        "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = to_regclass(%s) AND contype IN ('u', 'f')",
        [name],
    )
    unique: dict[str, str] = {}
    foreign: dict[str, str] = {}
    for conname, contype, definition in fetch():
        (unique if contype == "u" else foreign)[conname] = definition
    execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype = 'p'",
        [name],
    )
    return TableSchema(columns, fetch()[0][0], indexes, unique, foreign)
