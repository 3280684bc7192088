"""This package's tables compare text byte for byte: identifiers, topic names, keys and names
are case-, accent- and space-sensitive on every database, as the code treats them.

PostgreSQL and SQLite do so by default. On MariaDB/MySQL a table takes the database's default
collation, case-blind unless the project chose otherwise: there :func:`make_binary` converts
the tables to the server's binary NO PAD collation
(:func:`~django_tasks_coord.db.vendor.binary_collation`). Migration ``0019`` runs it for
every table of the package; a later migration that creates a table runs it for that table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_tasks_coord.db.vendor import binary_collation


def make_binary(conn: BaseDatabaseWrapper, tables: Iterable[str]) -> list[str]:
    """Convert ``tables`` (those that exist as tables) to the binary collation where the
    database needs one (a no-op elsewhere); return the tables converted.

    Each ``ALTER TABLE ... CONVERT TO CHARACTER SET utf8mb4 COLLATE ...`` rebuilds its table
    (MariaDB/MySQL copy it, writes wait): on a large task table, migrate in a quiet hour.
    MariaDB refuses to change a column that a foreign key joins, even with the checks off:
    the foreign keys between the tables are dropped first and made again after, as they were
    (unchecked: both sides change alike).
    """
    collation = binary_collation(conn)
    if collation is None:
        return []
    quote = conn.ops.quote_name
    with conn.cursor() as cursor:
        existing = {
            info.name for info in conn.introspection.get_table_list(cursor) if info.type == "t"
        }
        converted = [table for table in dict.fromkeys(tables) if table in existing]
        if not converted:
            return []
        keys = _foreign_keys(cursor, converted)
        cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
        try:
            for key in keys:
                cursor.execute(f"ALTER TABLE {quote(key.table)} DROP FOREIGN KEY {quote(key.name)}")
            for table in converted:
                cursor.execute(
                    f"ALTER TABLE {quote(table)} "
                    f"CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}"
                )
            for key in keys:
                cursor.execute(
                    f"ALTER TABLE {quote(key.table)} ADD CONSTRAINT {quote(key.name)} "
                    f"FOREIGN KEY ({', '.join(map(quote, key.columns))}) "
                    f"REFERENCES {quote(key.referenced)} "
                    f"({', '.join(map(quote, key.referenced_columns))}) "
                    f"ON DELETE {key.on_delete} ON UPDATE {key.on_update}"
                )
        finally:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
    return converted


@dataclass(frozen=True)
class _ForeignKey:
    table: str
    name: str
    columns: tuple[str, ...]
    referenced: str
    referenced_columns: tuple[str, ...]
    on_delete: str
    on_update: str


def _foreign_keys(cursor: Any, tables: list[str]) -> list[_ForeignKey]:
    """The foreign keys of this schema from or to one of ``tables`` (MariaDB/MySQL)."""
    marks = ", ".join(["%s"] * len(tables))
    cursor.execute(
        "SELECT k.TABLE_NAME, k.CONSTRAINT_NAME, k.COLUMN_NAME, k.REFERENCED_TABLE_NAME, "
        "k.REFERENCED_COLUMN_NAME, r.DELETE_RULE, r.UPDATE_RULE "
        "FROM information_schema.KEY_COLUMN_USAGE k "
        "JOIN information_schema.REFERENTIAL_CONSTRAINTS r "
        "ON r.CONSTRAINT_SCHEMA = k.CONSTRAINT_SCHEMA AND r.CONSTRAINT_NAME = k.CONSTRAINT_NAME "
        "AND r.TABLE_NAME = k.TABLE_NAME "
        "WHERE k.TABLE_SCHEMA = DATABASE() AND k.REFERENCED_TABLE_NAME IS NOT NULL "
        f"AND (k.TABLE_NAME IN ({marks}) OR k.REFERENCED_TABLE_NAME IN ({marks})) "
        "ORDER BY k.TABLE_NAME, k.CONSTRAINT_NAME, k.ORDINAL_POSITION",
        [*tables, *tables],
    )
    grouped: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for row in cursor.fetchall():
        grouped.setdefault((row[0], row[1]), []).append(row)
    return [
        _ForeignKey(
            table=table,
            name=name,
            columns=tuple(row[2] for row in rows),
            referenced=rows[0][3],
            referenced_columns=tuple(row[4] for row in rows),
            on_delete=rows[0][5],
            on_update=rows[0][6],
        )
        for (table, name), rows in grouped.items()
    ]
