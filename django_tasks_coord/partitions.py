"""PostgreSQL: the task table LIST-partitioned by topic, one partition per registered topic.

A partitioned task table keeps every topic's history in a table of its own: a claim,
a count or a purge of one topic touches that topic's partition and its indexes only,
however much history the other topics keep, and dropping a whole topic's history is
dropping a table. The primary key becomes ``(topic_id, sequence)`` (PostgreSQL requires
the partition key in every unique constraint); ``sequence`` stays unique because one
identity sequence numbers every row, and an extra index on ``sequence`` alone serves
look-ups by task number.

- **New installations** get a partitioned table from migration ``0009`` (the table is
  empty then, so it is converted in place).
- **Registering a topic** (:func:`django_tasks_coord.queue.register_topic`, or saving a
  new :class:`~django_tasks_coord.models.Topic` any other way) creates its partition in
  the same transaction (:func:`ensure_partition`). A *default* partition catches the
  tasks of topics created behind the ORM's back; their rows move to the topic's own
  partition when it is created.
- **Existing installations** with history are left unpartitioned by the migration (a
  long copy does not belong in a migration); ``manage.py tasks_coord_partition``
  converts the table online, in batches (:func:`convert`), and converts it back when
  ``TASKS_COORD["PARTITION_TASKS"]`` is turned off.

MySQL and MariaDB are not partitioned: InnoDB does not allow foreign keys on
partitioned tables, and the task table's foreign keys (its topic, its owner) are part
of what keeps the queue consistent. Their claim and housekeeping queries are served by
the same composite indexes, which lead with the topic.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_tasks_coord import db, dbviews
from django_tasks_coord.conf import app_settings
from django_tasks_coord.db.vendor import supports_partitioning
from django_tasks_coord.models import Task, Topic
from django_tasks_coord.pgcatalog import TableSchema, read_schema

logger = logging.getLogger(__name__)

#: The index on ``sequence`` alone that a partitioned table adds (its primary key leads with the topic).
SEQUENCE_INDEX = "tasks_coord_sequence"


def table() -> str:
    """The task table's name."""
    return Task._meta.db_table


def default_partition() -> str:
    """The partition that holds tasks of topics without a partition of their own."""
    return f"{table()}_default"


def partition_name(topic: str) -> str:
    """The partition table of ``topic``: readable, unique by a hash, within 63 characters."""
    slug = re.sub(r"[^a-z0-9]+", "_", topic.lower()).strip("_")[:24]
    digest = hashlib.sha256(topic.encode()).hexdigest()[:8]
    return f"{table()}_p_{slug}_{digest}" if slug else f"{table()}_p_{digest}"


def supported(connection: BaseDatabaseWrapper) -> bool:
    """Whether the task table can be partitioned on this database (PostgreSQL only)."""
    return supports_partitioning(connection)


def wanted(connection: BaseDatabaseWrapper) -> bool:
    """Whether the task table should be partitioned here (PostgreSQL, ``PARTITION_TASKS`` on)."""
    return supported(connection) and bool(app_settings.PARTITION_TASKS)


def is_partitioned(connection: BaseDatabaseWrapper) -> bool:
    """Whether the task table is partitioned."""
    if not supported(connection):
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(%s))",
            [table()],
        )
        return bool(cursor.fetchone()[0])


def partitions(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """The attached partitions of the task table: ``{partition table: bound}``.

    The bound is PostgreSQL's text, e.g. ``FOR VALUES IN ('emails')`` or ``DEFAULT``.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s) "
            "ORDER BY c.relname",
            [table()],
        )
        return dict(cursor.fetchall())


def ensure_partition(topic: str, using: str | None = None) -> bool:
    """Create and attach the partition of ``topic`` if the task table is partitioned.

    Idempotent; returns True if it attached a partition. Runs in the caller's
    transaction (a topic and its partition are created together). The partition is made
    as a plain table and then attached, which takes a ``SHARE UPDATE EXCLUSIVE`` lock on
    the task table (claims and completions go on) instead of the ``ACCESS EXCLUSIVE``
    of ``CREATE TABLE ... PARTITION OF``. Tasks of the topic found in the default
    partition move into the new partition first.
    """
    connection = connections[using or db.alias()]
    if not supported(connection):
        return False
    quote = connection.ops.quote_name
    parent, name, default = table(), partition_name(topic), default_partition()
    with connection.cursor() as cursor:
        # An existing topic (every node start registers its topics): one catalog query.
        if _attached(cursor, name) or not is_partitioned(connection):
            return False
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        # One lock order for everyone who attaches: the task table (SHARE UPDATE EXCLUSIVE
        # conflicts with itself, so attaching is one at a time), then the default partition.
        cursor.execute(f"LOCK TABLE {quote(parent)} IN SHARE UPDATE EXCLUSIVE MODE")
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [default])
        has_default = cursor.fetchone()[0]
        if has_default:
            cursor.execute(f"LOCK TABLE {quote(default)} IN ACCESS EXCLUSIVE MODE")
        if _attached(cursor, name):  # another process attached it while we waited
            return False
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(name)} "
            f"(LIKE {quote(parent)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        if has_default:
            cursor.execute(
                f"WITH moved AS (DELETE FROM {quote(default)} WHERE topic_id = %s RETURNING *) "
                f"INSERT INTO {quote(name)} SELECT * FROM moved",
                [topic],
            )
        cursor.execute(
            f"ALTER TABLE {quote(parent)} ATTACH PARTITION {quote(name)} FOR VALUES IN (%s)",
            [topic],
        )
    logger.info(
        "Created partition %s for topic %r.",
        name,
        topic,
        extra={"topic": topic, "partition": name},
    )
    return True


def _attached(cursor: object, name: str) -> bool:
    """Whether the table ``name`` is attached to the task table as a partition."""
    cursor.execute(  # type: ignore[attr-defined]
        "SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(%s) "
        "AND inhparent = to_regclass(%s))",
        [name, table()],
    )
    return bool(cursor.fetchone()[0])  # type: ignore[attr-defined]


def orphans(connection: BaseDatabaseWrapper) -> list[str]:
    """Partitions of topics that no longer exist (left behind when a topic is deleted)."""
    names = {
        partition_name(t)
        for t in Topic.objects.using(connection.alias).values_list("pk", flat=True)
    }
    return [
        p for p, bound in partitions(connection).items() if bound != "DEFAULT" and p not in names
    ]


def drop_orphans(connection: BaseDatabaseWrapper) -> list[str]:
    """Drop the (empty) partitions of deleted topics; return their names.

    A topic is deleted only once it has no tasks (its tasks PROTECT it), so these
    partitions are empty. Not done when a topic is deleted, because dropping a partition
    locks the whole task table for a moment; ``tasks_coord_partition`` does it.
    """
    quote = connection.ops.quote_name
    dropped = []
    for name in orphans(connection):
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {quote(name)})")
            if cursor.fetchone()[0]:
                logger.warning("Partition %s of a deleted topic is not empty; kept.", name)
                continue
            cursor.execute(f"ALTER TABLE {quote(table())} DETACH PARTITION {quote(name)}")
            cursor.execute(f"DROP TABLE {quote(name)}")
        dropped.append(name)
    return dropped


# --- converting the table -------------------------------------------------------------------


def _temporary(name: str, tag: str) -> str:
    return f"tc{tag}_{hashlib.sha256(name.encode()).hexdigest()[:24]}"


def convert(
    using: str | None = None,
    *,
    partitioned: bool = True,
    batch_size: int = 10_000,
    keep_old: bool = False,
    progress: Callable[[str], None] | None = None,
) -> bool:
    """Rebuild the task table partitioned by topic (or back to one table); True if it did.

    Online and in batches, so nodes keep working while it runs:

    1. A new table of the wanted shape is created beside the old one, with every index,
       constraint, foreign key and (partitioned) a partition per topic plus the default
       one; a trigger on the old table mirrors every insert, update and delete into it.
    2. The rows that existed when the trigger was installed are copied in batches of
       ``batch_size``, each batch its own transaction, in sequence order. A batch locks
       its rows ``FOR SHARE`` (an update or delete of those rows waits for the batch to
       commit, a claim skips them for that moment), so no change can slip between the
       copy and the trigger.
    3. One short transaction takes the old table's ``ACCESS EXCLUSIVE`` lock, drops the
       trigger, swaps the names of tables, indexes, constraints and identity sequences,
       moves the sequence on, and drops the old table (or keeps it as
       ``<table>_old`` with ``keep_old``).

    Must not run inside a transaction (the batches commit one by one).
    """
    connection = connections[using or db.alias()]
    if not supported(connection):
        raise NotImplementedError("Only PostgreSQL's task table can be partitioned.")
    if is_partitioned(connection) == partitioned:
        return False
    say = progress or (lambda message: None)
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        conversion = _Conversion(connection, partitioned, read_schema(cursor, table()))
        conversion.create_new_table(cursor)
        last = conversion.install_mirror(cursor)
    say(f"Created {conversion.new}; copying rows up to sequence {last} in batches of {batch_size}.")
    copied = conversion.copy_rows(last, batch_size, say)
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        conversion.swap(cursor, keep_old=keep_old)
    say(
        f"{conversion.old} is now {'partitioned by topic' if partitioned else 'one table'}"
        f"{f'; the old table is kept as {conversion.retired}' if keep_old else ''}."
    )
    logger.info(
        "Converted the task table (%s rows copied in batches).",
        copied,
        extra={"partitioned": partitioned, "rows": copied},
    )
    return True


class _Conversion:
    """The steps of :func:`convert`, from the old table's ``schema`` to a table of the new shape."""

    def __init__(
        self, connection: BaseDatabaseWrapper, partitioned: bool, schema: TableSchema
    ) -> None:
        self.connection = connection
        self.partitioned = partitioned
        self.schema = schema
        self.quote = connection.ops.quote_name
        self.old, self.new = table(), f"{table()}_new"
        self.retired = f"{self.old}_old"
        self.trigger_function = f"{table()}_mirror"
        # Partitioned, the primary key leads with the topic: look-ups by number need their own index.
        self.new_indexes = [name for name in schema.indexes if name != SEQUENCE_INDEX]
        self.columns = ", ".join(self.quote(c) for c in schema.columns)
        self.conflict = "topic_id, sequence" if partitioned else "sequence"

    def create_new_table(self, cursor: Any) -> None:
        """Step 1: the new table with every key, index, foreign key and partition."""
        quote, schema, new = self.quote, self.schema, self.new
        cursor.execute(f"DROP TABLE IF EXISTS {quote(new)}, {quote(self.retired)} CASCADE")
        shape = " PARTITION BY LIST (topic_id)" if self.partitioned else ""
        cursor.execute(
            f"CREATE TABLE {quote(new)} (LIKE {quote(self.old)} INCLUDING DEFAULTS INCLUDING "
            f"CONSTRAINTS INCLUDING IDENTITY INCLUDING STORAGE INCLUDING COMMENTS){shape}"
        )
        key = "topic_id, sequence" if self.partitioned else "sequence"
        cursor.execute(
            f"ALTER TABLE {quote(new)} ADD CONSTRAINT {quote(_temporary(schema.primary_key, 'n'))} "
            f"PRIMARY KEY ({key})"
        )
        for name, definition in schema.unique.items():
            cursor.execute(
                f"ALTER TABLE {quote(new)} ADD CONSTRAINT {quote(_temporary(name, 'n'))} "
                f"{definition}"
            )
        for name in self.new_indexes:
            head = re.match(r"^CREATE (UNIQUE )?INDEX \S+ ON (ONLY )?\S+ ", schema.indexes[name])
            assert head is not None, schema.indexes[name]
            cursor.execute(
                f"CREATE {head[1] or ''}INDEX {quote(_temporary(name, 'n'))} ON {quote(new)} "
                + schema.indexes[name][head.end() :]
            )
        if self.partitioned:
            self.new_indexes.append(SEQUENCE_INDEX)
            cursor.execute(
                f"CREATE INDEX {quote(_temporary(SEQUENCE_INDEX, 'n'))} ON {quote(new)} (sequence)"
            )
        for name, definition in schema.foreign.items():
            cursor.execute(f"ALTER TABLE {quote(new)} ADD CONSTRAINT {quote(name)} {definition}")
        if self.partitioned:
            cursor.execute(
                f"CREATE TABLE {quote(default_partition() + '_new')} PARTITION OF {quote(new)} DEFAULT"
            )
            for topic in Topic.objects.using(self.connection.alias).values_list("pk", flat=True):
                cursor.execute(
                    f"CREATE TABLE {quote(partition_name(topic))} PARTITION OF {quote(new)} "
                    f"FOR VALUES IN (%s)",
                    [topic],
                )

    def install_mirror(self, cursor: Any) -> int:
        """Step 1 still: every change to the old table from now on reaches the new one.

        Returns the last sequence of the old table then: the copy's end.
        """
        quote, new, trigger_function = self.quote, self.new, self.trigger_function
        columns = self.columns
        updates = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in self.schema.columns)
        cursor.execute(
            f"""
            CREATE OR REPLACE FUNCTION {quote(trigger_function)}() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP IN ('DELETE', 'UPDATE') THEN
                    DELETE FROM {quote(new)} WHERE topic_id = OLD.topic_id AND sequence = OLD.sequence;
                END IF;
                IF TG_OP = 'DELETE' THEN
                    RETURN OLD;
                END IF;
                INSERT INTO {quote(new)} ({columns}) SELECT (NEW).*
                    ON CONFLICT ({self.conflict}) DO UPDATE SET {updates};
                RETURN NEW;
            END $$
            """
        )
        cursor.execute(
            f"CREATE TRIGGER {quote(trigger_function)} AFTER INSERT OR UPDATE OR DELETE ON "
            f"{quote(self.old)} FOR EACH ROW EXECUTE FUNCTION {quote(trigger_function)}()"
        )
        cursor.execute(f"SELECT coalesce(max(sequence), 0) FROM {quote(self.old)}")
        return int(cursor.fetchone()[0])

    def copy_rows(self, last: int, batch_size: int, say: Callable[[str], None]) -> int:
        """Step 2: the rows up to ``last``, in batches; returns how many were copied."""
        quote, connection, old, columns = self.quote, self.connection, self.old, self.columns
        start, copied = 0, 0
        select = (
            f"INSERT INTO {quote(self.new)} ({columns}) SELECT {columns} FROM {quote(old)} "
            f"WHERE sequence > %s AND sequence <= %s FOR SHARE ON CONFLICT ({self.conflict}) "
            "DO NOTHING"
        )
        while start < last:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                # The batch ends at its batch_size-th row: numbers have gaps (deleted tasks).
                cursor.execute(
                    f"SELECT sequence FROM {quote(old)} WHERE sequence > %s ORDER BY sequence "
                    f"OFFSET %s LIMIT 1",
                    [start, batch_size - 1],
                )
                row = cursor.fetchone()
                end = min(int(row[0]), last) if row else last
                cursor.execute(select, [start, end])
                copied += max(cursor.rowcount, 0)
            start = end
            say(f"Copied up to sequence {end} ({copied} rows).")
        return copied

    def swap(self, cursor: Any, *, keep_old: bool) -> None:
        """Step 3: under the old table's lock, the new table and its names take its place."""
        quote, schema, old, new = self.quote, self.schema, self.old, self.new
        cursor.execute(f"LOCK TABLE {quote(old)} IN ACCESS EXCLUSIVE MODE")
        view = dbviews.exists(self.connection)
        if view:
            dbviews.drop(self.connection)
        cursor.execute(f"DROP TRIGGER {quote(self.trigger_function)} ON {quote(old)}")
        cursor.execute(f"DROP FUNCTION {quote(self.trigger_function)}()")
        # Names: the old table's move aside, the new table's take their place.
        for name in [schema.primary_key, *schema.unique]:
            cursor.execute(
                f"ALTER TABLE {quote(old)} RENAME CONSTRAINT {quote(name)} "
                f"TO {quote(_temporary(name, 'o'))}"
            )
        for name in schema.indexes:
            cursor.execute(f"ALTER INDEX {quote(name)} RENAME TO {quote(_temporary(name, 'o'))}")
        for name in [schema.primary_key, *schema.unique]:
            cursor.execute(
                f"ALTER TABLE {quote(new)} RENAME CONSTRAINT {quote(_temporary(name, 'n'))} "
                f"TO {quote(name)}"
            )
        for name in self.new_indexes:
            cursor.execute(f"ALTER INDEX {quote(_temporary(name, 'n'))} RENAME TO {quote(name)}")
        self._swap_tables(cursor)
        if not keep_old:
            cursor.execute(f"DROP TABLE {quote(self.retired)} CASCADE")
        if view:
            dbviews.create(self.connection)

    def _swap_tables(self, cursor: Any) -> None:
        """Rename the tables and their identity sequences; the new one numbers on."""
        quote, old, new, retired = self.quote, self.old, self.new, self.retired
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'sequence')", [old])
        old_sequence = cursor.fetchone()[0]
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'sequence')", [new])
        new_sequence = cursor.fetchone()[0]
        cursor.execute("SELECT setval(%s, nextval(%s))", [new_sequence, old_sequence])
        cursor.execute(f"ALTER TABLE {quote(old)} RENAME TO {quote(retired)}")
        cursor.execute(
            f"ALTER SEQUENCE {old_sequence} RENAME TO {quote(retired + '_sequence_seq')}"
        )
        cursor.execute(f"ALTER TABLE {quote(new)} RENAME TO {quote(old)}")
        cursor.execute(f"ALTER SEQUENCE {new_sequence} RENAME TO {quote(old + '_sequence_seq')}")
        if self.partitioned:
            cursor.execute(
                f"ALTER TABLE {quote(default_partition() + '_new')} RENAME TO {quote(default_partition())}"
            )
