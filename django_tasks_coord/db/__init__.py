"""The database seam: everything that differs between PostgreSQL, MySQL/MariaDB and SQLite.

The rest of the package talks to the database through Django's ORM and these helpers;
none of it branches on ``connection.vendor`` (only :mod:`.vendor` does, and the
migration that adds MySQL's virtual column). Each helper says why it exists.

- :mod:`.transactions`: the app's alias, write transactions (SQLite's write lock taken
  first), row locks for claims, the database clock.
- :mod:`.vendor`: capabilities and quirks: row estimates, lock windows, ``LISTEN``
  support, SQLite's single write lock, MySQL's virtual columns, partitioning.
- :mod:`.reconnect`: recognizing a lost connection; the back-off every loop uses.
- :mod:`.notifications`: wake-ups after the commit: ``NOTIFY`` (PostgreSQL), this
  process's listeners elsewhere.
- :mod:`.listen`: the one LISTEN connection policy of the node and the long-polls.
- :mod:`.indexes`: :class:`PartialStateIndex` (``PendingIndex`` in old migrations).

Everything is importable from here (``from django_tasks_coord import db``; ``db.alias()``).
"""

from __future__ import annotations

from django_tasks_coord.db.indexes import PartialStateIndex, PendingIndex
from django_tasks_coord.db.listen import Listening, listen_alias, listen_params
from django_tasks_coord.db.notifications import (
    NOTIFY_CHANNEL,
    add_local_listener,
    announce,
    notify,
    remove_local_listener,
    wake,
    wakes_by_notify,
    wakes_with_statement,
    with_wake,
)
from django_tasks_coord.db.reconnect import (
    OUTAGE,
    RECONNECT_DELAY,
    RECONNECT_MAX_DELAY,
    STALE_WINDOW,
    Backoff,
    Outage,
    Reconnect,
    connection_lost,
    reset_connection,
    retry_while_lost,
    wait_for_database,
)
from django_tasks_coord.db.transactions import (
    ago,
    alias,
    connection,
    lock_kwargs,
    serialize_claims,
    write_transaction,
)
from django_tasks_coord.db.vendor import (
    CLAIM_JOINED,
    CLAIM_LOCKED,
    CLAIM_RETURNING,
    binary_collation,
    checks_topic_in_insert,
    claim_statement,
    hands_out_in_one_statement,
    has_notify,
    has_row_estimates,
    inserts_from_arrays,
    locks_whole_database,
    planner_rows,
    reset_lock_window,
    set_lock_window,
    share_lock_clause,
    subqueries_lock,
    supports_listen,
    supports_partitioning,
    table_rows,
    topic_in_key_lookups,
    upsert_clause,
    uses_virtual_columns,
)

__all__ = [
    "CLAIM_JOINED",
    "CLAIM_LOCKED",
    "CLAIM_RETURNING",
    "NOTIFY_CHANNEL",
    "OUTAGE",
    "RECONNECT_DELAY",
    "RECONNECT_MAX_DELAY",
    "STALE_WINDOW",
    "Backoff",
    "Listening",
    "Outage",
    "PartialStateIndex",
    "PendingIndex",
    "Reconnect",
    "add_local_listener",
    "ago",
    "alias",
    "announce",
    "binary_collation",
    "checks_topic_in_insert",
    "claim_statement",
    "connection",
    "connection_lost",
    "hands_out_in_one_statement",
    "has_notify",
    "has_row_estimates",
    "inserts_from_arrays",
    "listen_alias",
    "listen_params",
    "lock_kwargs",
    "locks_whole_database",
    "notify",
    "planner_rows",
    "remove_local_listener",
    "reset_connection",
    "reset_lock_window",
    "retry_while_lost",
    "serialize_claims",
    "set_lock_window",
    "share_lock_clause",
    "subqueries_lock",
    "supports_listen",
    "supports_partitioning",
    "table_rows",
    "topic_in_key_lookups",
    "upsert_clause",
    "uses_virtual_columns",
    "wait_for_database",
    "wake",
    "wakes_by_notify",
    "wakes_with_statement",
    "with_wake",
    "write_transaction",
]
