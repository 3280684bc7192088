"""What each database can do, and its quirks: the only module that looks at ``connection.vendor``.

Callers ask a question named for what they need (:func:`supports_listen`,
:func:`has_row_estimates`, :func:`locks_whole_database`...) and never branch on the
vendor themselves. Each answer says which databases give it and why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import timedelta
from importlib.util import find_spec
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

_POSTGRESQL, _MYSQL, _SQLITE = "postgresql", "mysql", "sqlite"


def _is_mariadb(conn: BaseDatabaseWrapper) -> bool:
    return conn.vendor == _MYSQL and bool(getattr(conn, "mysql_is_mariadb", False))


# --- locking -------------------------------------------------------------------------------


def locks_whole_database(conn: BaseDatabaseWrapper) -> bool:
    """Whether the database has one write lock for everything instead of row locks (SQLite).

    There claims are serialized (:func:`~django_tasks_coord.db.serialize_claims`), one
    node is all it serves, and an ``OperationalError`` during a lock is its
    "database is locked", never a ``NOWAIT`` refusal of a row another process holds.
    """
    return conn.vendor == _SQLITE


#: How a claim is written (:func:`claim_statement`).
CLAIM_RETURNING, CLAIM_JOINED, CLAIM_LOCKED = "returning", "joined", "locked"


def claim_statement(conn: BaseDatabaseWrapper) -> str:
    """How a claim takes its rows in the fewest round trips the database allows.

    - :data:`CLAIM_RETURNING` (PostgreSQL; SQLite 3.35+): one ``UPDATE ... RETURNING``
      whose CTE picks the due rows (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; on SQLite
      the statement holds the database's write lock), autocommitted: one round trip.
    - :data:`CLAIM_JOINED` (MariaDB, which has no ``UPDATE ... RETURNING``): one
      ``UPDATE`` joined to a derived table that picks the rows (``SKIP LOCKED``; read
      first, ``STRAIGHT_JOIN``, so that no other row is locked), autocommitted, then a
      ``SELECT`` of the rows under the claim's new ``exec_id``: two round trips, one
      when nothing is due.
    - :data:`CLAIM_LOCKED` (MySQL, older SQLite): ``SELECT ... FOR UPDATE SKIP LOCKED``
      and ``UPDATE`` in one transaction.
    """
    if conn.vendor == _POSTGRESQL:
        return CLAIM_RETURNING
    if conn.vendor == _SQLITE and conn.features.can_return_columns_from_insert:
        return CLAIM_RETURNING  # RETURNING came with SQLite 3.35, for UPDATE as for INSERT
    if _is_mariadb(conn):
        return CLAIM_JOINED
    return CLAIM_LOCKED


def subqueries_lock(conn: BaseDatabaseWrapper) -> bool:
    """Whether a subquery of a locking read (``SELECT ... FOR UPDATE``, a joined ``UPDATE``)
    locks the rows it reads, waiting for those another transaction holds (MariaDB, MySQL;
    ``SKIP LOCKED`` skips only the rows the outer query picks). On PostgreSQL such a
    subquery reads a snapshot; SQLite locks the whole database anyway."""
    return conn.vendor == _MYSQL


def set_lock_window(conn: BaseDatabaseWrapper, limit: timedelta) -> None:
    """Let the server end the current transaction if its process freezes in it for ``limit``.

    For a transaction that locks a row others wait on (the token row): a process
    stopped (SIGSTOP, a VM pause) while holding the lock would keep it; with this the
    server rolls the frozen transaction back and the others go on. PostgreSQL:
    ``idle_in_transaction_session_timeout`` (milliseconds, at least 100), local to the
    transaction. MariaDB: ``idle_transaction_timeout`` (whole seconds, at least 1), a
    session variable that :func:`reset_lock_window` sets back once the transaction is
    over. MySQL and SQLite have no such setting: nothing happens there.
    """
    if conn.vendor == _POSTGRESQL:
        milliseconds = max(int(limit.total_seconds() * 1000), 100)
        with conn.cursor() as cursor:
            cursor.execute(f"SET LOCAL idle_in_transaction_session_timeout = {milliseconds}")
    elif _is_mariadb(conn):
        seconds = max(math.ceil(limit.total_seconds()), 1)
        with conn.cursor() as cursor:
            cursor.execute(f"SET SESSION idle_transaction_timeout = {seconds}")


def reset_lock_window(conn: BaseDatabaseWrapper) -> None:
    """After a transaction that called :func:`set_lock_window`: MariaDB's session default back.

    Nothing to do elsewhere (PostgreSQL's setting ended with the transaction), nor on a
    closed connection; a session the server ended meanwhile is left alone.
    """
    if not _is_mariadb(conn) or conn.connection is None:
        return
    try:
        with conn.cursor() as cursor:
            cursor.execute("SET SESSION idle_transaction_timeout = DEFAULT")
    except DatabaseError:  # the server ended the session: nothing to reset
        pass


# --- notifications -------------------------------------------------------------------------


def has_notify(conn: BaseDatabaseWrapper) -> bool:
    """Whether ``NOTIFY`` can announce work to other processes, delivered at commit (PostgreSQL)."""
    return conn.vendor == _POSTGRESQL


def checks_topic_in_insert(conn: BaseDatabaseWrapper) -> bool:
    """Whether an insert into a caller's transaction checks its topic in the same statement.

    PostgreSQL: the ``INSERT ... RETURNING`` inside a ``WITH`` whose ``SELECT`` also
    reads whether the topic exists (``store.insert``). The task table's foreign key to
    its topic is checked at commit there, and on SQLite, so a topic deleted behind a
    stale cache would otherwise surface as an ``IntegrityError`` at the caller's commit;
    SQLite has no data-modifying ``WITH``, so the topic is looked up first there
    (``topics.adding_tasks``). MySQL/MariaDB check foreign keys per statement.
    """
    return conn.vendor == _POSTGRESQL


def supports_listen(alias: str) -> bool:
    """Whether a process can ``LISTEN`` for the notifications of the database behind ``alias``.

    PostgreSQL, with psycopg 3 installed (the LISTEN connections of
    :mod:`~django_tasks_coord.db.listen` use it whatever driver Django uses).
    """
    return has_notify(connections[alias]) and find_spec("psycopg") is not None


# --- estimates -----------------------------------------------------------------------------


def has_row_estimates(conn: BaseDatabaseWrapper) -> bool:
    """Whether the planner can estimate a query's rows without running it (not SQLite).

    Counts that must stay cheap on big tables (the admin's changelist, the metrics
    view) fall back on exact counts where this is False.
    """
    return conn.vendor in (_POSTGRESQL, _MYSQL)


def planner_rows(conn: BaseDatabaseWrapper, sql: str, params: Sequence[Any] = ()) -> int | None:
    """The planner's estimate of the rows ``sql`` returns, without running it (``EXPLAIN``).

    PostgreSQL from its statistics, MySQL/MariaDB from index dives or InnoDB's
    statistics. None on SQLite, which keeps no estimate (:func:`has_row_estimates`).
    """
    with conn.cursor() as cursor:
        if conn.vendor == _POSTGRESQL:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
            if isinstance(plan, str):  # pragma: no cover - psycopg returns it parsed
                plan = json.loads(plan)
            return int(plan[0]["Plan"]["Plan Rows"])
        if conn.vendor == _MYSQL:
            cursor.execute(f"EXPLAIN {sql}", params)
            names = [column[0].lower() for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            return max((int(row["rows"] or 0) for row in rows), default=0)
    return None


def table_rows(conn: BaseDatabaseWrapper, table: str) -> int | None:
    """The estimated number of rows of the whole ``table``, or None where there is none.

    PostgreSQL: ``EXPLAIN`` of a full scan (``reltuples`` scaled to the table's current
    size, as the planner does). MySQL/MariaDB: InnoDB's ``TABLE_ROWS`` estimate.
    SQLite keeps no estimate.
    """
    if conn.vendor == _POSTGRESQL:
        return planner_rows(conn, f"SELECT 1 FROM {conn.ops.quote_name(table)}")
    if conn.vendor == _MYSQL:
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT TABLE_ROWS FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                [table],
            )
            row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])
    return None


# --- the task table's shape ----------------------------------------------------------------


def supports_partitioning(conn: BaseDatabaseWrapper) -> bool:
    """Whether the task table can be partitioned by topic (PostgreSQL only).

    InnoDB does not allow foreign keys on partitioned tables, and SQLite has no
    partitions (see :mod:`django_tasks_coord.partitions`).
    """
    return conn.vendor == _POSTGRESQL


def inserts_from_arrays(conn: BaseDatabaseWrapper) -> bool:
    """Whether many rows can be inserted from one array per column (``UNNEST``, PostgreSQL).

    The task store's bulk appends send the columns that vary from row to row as arrays
    and the others once, instead of a value per row and column.
    """
    return conn.vendor == _POSTGRESQL


def uses_virtual_columns(conn: BaseDatabaseWrapper) -> bool:
    """Whether the task table carries generated columns in place of partial indexes.

    MySQL/MariaDB have no partial indexes, so migration 0011 adds the virtual column
    :data:`~django_tasks_coord.models.UNFINISHED_IDENTIFIER` there (and only there),
    indexed instead; queries name it rather than the expression it stands for (MariaDB
    never rewrites an expression into a generated column on its own).
    """
    return conn.vendor == _MYSQL


def hands_out_in_one_statement(conn: BaseDatabaseWrapper) -> bool:
    """Whether the executor API's claim can be one statement: ``UPDATE ... FROM (SELECT ...
    FOR UPDATE SKIP LOCKED) RETURNING``, each row's ``exec_id`` (``gen_random_uuid()``) and
    attempt log entry (``jsonb``) made by the database (PostgreSQL). Elsewhere it is a
    transaction of a locking ``SELECT`` and an ``UPDATE``."""
    return conn.vendor == _POSTGRESQL


def topic_in_key_lookups(conn: BaseDatabaseWrapper) -> bool:
    """Whether a lookup of tasks by key should name their topics too.

    Yes on PostgreSQL, where the topic lets the planner look only into those topics'
    partitions (the table may be partitioned), and on SQLite, where it costs nothing.
    Not on MySQL/MariaDB: one table there, so the topic buys nothing; worse, with it
    MySQL may walk an index of the topic's rows instead of looking the keys up, and then
    wait on a row another transaction holds (one ``SKIP LOCKED`` left out).
    """
    return conn.vendor != _MYSQL


def share_lock_clause(conn: BaseDatabaseWrapper) -> str:
    """The clause that makes a ``SELECT`` (an ``INSERT ... SELECT``'s too) read the latest
    committed rows and hold them against changes until the commit: ``FOR SHARE``
    (PostgreSQL), ``LOCK IN SHARE MODE`` (MySQL/MariaDB); none on SQLite, whose writes are
    serialized anyway. Written with a leading space, or empty."""
    if conn.vendor == _POSTGRESQL:
        return " FOR SHARE"
    if conn.vendor == _MYSQL:
        return " LOCK IN SHARE MODE"
    return ""


def upsert_clause(
    conn: BaseDatabaseWrapper, conflict: Sequence[str], columns: Sequence[str]
) -> str:
    """The clause of an ``INSERT`` that replaces ``columns`` of the row already holding the
    unique ``conflict`` columns: ``ON DUPLICATE KEY UPDATE`` (MySQL/MariaDB, which finds
    the unique key itself), ``ON CONFLICT (...) DO UPDATE`` (PostgreSQL, SQLite). Written
    with a leading space."""
    quote = conn.ops.quote_name
    if conn.vendor == _MYSQL:
        return " ON DUPLICATE KEY UPDATE " + ", ".join(
            f"{quote(c)} = VALUES({quote(c)})" for c in columns
        )
    keys = ", ".join(quote(c) for c in conflict)
    return f" ON CONFLICT ({keys}) DO UPDATE SET " + ", ".join(
        f"{quote(c)} = EXCLUDED.{quote(c)}" for c in columns
    )


# --- text comparison -----------------------------------------------------------------------

#: Collations under which MariaDB/MySQL compare text byte for byte, trailing spaces included,
#: best first: MariaDB's (10.2+) and MySQL's (8.0.17+). ``utf8mb4_bin`` is binary but PAD
#: SPACE: "a" and "a " are equal there, one unique key.
_BINARY_NO_PAD = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")


def binary_collation(conn: BaseDatabaseWrapper) -> str | None:
    """The collation this package's tables must have for identifiers, topic names, keys and
    names to compare as the code compares them (case, accents and trailing spaces count), or
    None where the tables compare text that way already (PostgreSQL's deterministic default
    collations, SQLite's BINARY).

    MariaDB/MySQL: a new table takes the database's default collation, case-blind by default
    (``utf8mb4_general_ci``, ``utf8mb4_uca1400_ai_ci``, ``utf8mb4_0900_ai_ci``), so "Order-1"
    and "order-1" were one identifier. The first of :data:`_BINARY_NO_PAD` the server has
    (``utf8mb4_bin`` on a server with neither: binary, but trailing spaces ignored).
    """
    if conn.vendor != _MYSQL:
        return None
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN "
            f"({', '.join(['%s'] * len(_BINARY_NO_PAD))})",
            _BINARY_NO_PAD,
        )
        found = {row[0] for row in cursor.fetchall()}
    return next((name for name in _BINARY_NO_PAD if name in found), "utf8mb4_bin")
