"""Small helpers that hide the differences between PostgreSQL, MySQL/MariaDB and SQLite.

Each one says why it exists; callers never branch on ``connection.vendor`` themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import InterfaceError, OperationalError, connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.backends.ddl_references import Columns, Statement, Table
from django.db.models.functions import Now

from django_tasks_coord.conf import app_settings

logger = logging.getLogger(__name__)


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
    instead. Call it as the first statement inside ``transaction.atomic``; a no-op
    elsewhere.
    """
    if conn.vendor != "sqlite":
        return
    from django_tasks_coord.models import Topic

    with conn.cursor() as cursor:
        table = conn.ops.quote_name(Topic._meta.db_table)
        cursor.execute(f"UPDATE {table} SET paused = paused WHERE 1 = 0")


def ago(delta: timedelta) -> models.Expression:
    """``NOW() - delta`` on the database clock (heartbeats are compared with it)."""
    return models.ExpressionWrapper(Now() - delta, output_field=models.DateTimeField())


#: Seconds a loop waits after its database connection broke, doubled after each failed
#: retry up to :data:`RECONNECT_MAX_DELAY` (see :class:`Reconnect`).
RECONNECT_DELAY = 0.25
#: The longest wait between two reconnection attempts: a node notices that the database is
#: back within this many seconds.
RECONNECT_MAX_DELAY = 2.0

#: MySQL/MariaDB client and server error codes that mean the connection is gone: can't
#: connect (2002, 2003), server has gone away (2006), lost connection (2013, 2055), the
#: connection was killed (1927) or timed out idle (4031), server shutting down (1053).
_MYSQL_LOST_CODES = frozenset({1053, 1927, 2002, 2003, 2006, 2013, 2055, 4031})
#: PostgreSQL SQLSTATEs that mean the same: class 08 (connection exception), the server
#: shutting down (57P01 admin, 57P02 crash) or not accepting connections yet (57P03).
_PG_LOST_STATES = ("08", "57P01", "57P02", "57P03")
#: Messages of driver errors that carry no code (psycopg once its connection is broken).
_LOST_PHRASES = (
    "connection is lost",
    "connection is closed",
    "connection already closed",
    "server closed the connection",
    "terminating connection",
    "consuming input failed",
    "no connection to the server",
    "could not connect",
    "connection refused",
    "connection reset",
    "lost connection",
    "gone away",
    "broken pipe",
    "the database system is",
)


def _kinds(error: BaseException) -> set[str]:
    return {klass.__name__ for klass in type(error).__mro__}


def connection_lost(error: BaseException) -> bool:
    """Whether ``error`` means that the database connection broke, not that a statement failed.

    True for the errors of a restarted or unreachable server, of a connection the server
    terminated (``pg_terminate_backend``, ``KILL CONNECTION``) and of any later use of
    such a connection: Django's ``InterfaceError``, and ``OperationalError`` errors whose
    PostgreSQL SQLSTATE, MySQL/MariaDB error code or message says so. Driver errors
    (psycopg, MySQLdb) are recognized too, and so are errors chained to one
    (``__cause__``). A deadlock, a lock timeout or SQLite's "database is locked" are not.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kinds = _kinds(current)
        if isinstance(current, InterfaceError) or "InterfaceError" in kinds:
            return True
        if isinstance(current, OperationalError) or "OperationalError" in kinds:
            state = str(getattr(current, "sqlstate", None) or getattr(current, "pgcode", "") or "")
            if state and state.startswith(_PG_LOST_STATES):
                return True
            code = current.args[0] if current.args else None
            if isinstance(code, int) and code in _MYSQL_LOST_CODES:
                return True
            if any(phrase in str(current).lower() for phrase in _LOST_PHRASES):
                return True
        current = current.__cause__ or current.__context__
    return False


def reset_connection(using: str | None = None) -> None:
    """Close this thread's connection to ``using`` (default :func:`alias`), whatever its state.

    The next query opens a new one. Django never does this by itself outside a request:
    a thread that keeps a broken connection fails every query from then on. Inside an
    atomic block Django marks the block for rollback and the connection is dropped
    when the block exits. Errors while closing a dead connection are ignored.
    """
    conn = connections[using or alias()]
    try:
        conn.close()
    except Exception:  # the connection is dead anyway
        logger.debug("Closing a broken connection failed.", exc_info=True)
        if not conn.in_atomic_block:
            conn.connection = None


class Reconnect:
    """The back-off of one loop whose database connection may break: close, wait, go on.

    :meth:`failed` closes the thread's connection (:func:`reset_connection`) and returns
    how long to wait before trying again: ``first`` (:data:`RECONNECT_DELAY`), doubled
    after each further failure up to ``cap`` (:data:`RECONNECT_MAX_DELAY`). :meth:`succeeded` resets it. The
    first failure of an outage is logged as a WARNING, the others at DEBUG, and the end
    of the outage at INFO, so an outage costs each loop two log lines, not one per try.
    """

    def __init__(
        self,
        what: str,
        *,
        first: float | None = None,
        cap: float | None = None,
        using: str | None = None,
    ) -> None:
        self.what = what
        self.first = RECONNECT_DELAY if first is None else first
        self.cap = max(RECONNECT_MAX_DELAY if cap is None else cap, self.first)
        self.using = using
        self.failures = 0
        self._since = 0.0

    @property
    def delay(self) -> float:
        """Seconds to wait after the latest failure."""
        if not self.failures:
            return 0.0
        return min(self.first * 2.0 ** (self.failures - 1), self.cap)

    def failed(self, error: BaseException) -> float:
        """One more failure: close the connection; return the seconds to wait before retrying."""
        reset_connection(self.using)
        self.failures += 1
        lost = connection_lost(error)
        if self.failures == 1:
            self._since = time.monotonic()
            logger.warning(
                "%s: %s (%s); retrying in %ss.",
                self.what,
                "the database connection was lost" if lost else "a database error",
                error,
                self.delay,
            )
        else:
            logger.debug("%s: still failing (%s); retrying in %ss.", self.what, error, self.delay)
        return self.delay

    def succeeded(self) -> None:
        """The loop reached the database again."""
        if self.failures:
            logger.info(
                "%s: the database answers again (after %s failed attempt(s), %.1fs).",
                self.what,
                self.failures,
                time.monotonic() - self._since,
            )
        self.failures = 0


def retry_while_lost[T](
    call: Callable[[], T],
    *,
    what: str,
    wait: Callable[[float], bool] | None = None,
    using: str | None = None,
) -> T:
    """Return ``call()``, called again (after :class:`Reconnect`'s back-off) as long as it
    fails because the database connection broke (:func:`connection_lost`).

    ``wait(seconds)`` sleeps between tries and returns True to give up, in which case
    the last error is raised; by default it sleeps and never gives up. Any other error
    is raised at once. ``call`` must be safe to repeat: the retried writes of this
    package are fenced by the claim they complete, so one that was committed before
    the connection broke matches nothing the second time. Inside an atomic block nothing
    is retried (the whole transaction is lost): the error is raised for the caller of the
    outermost block to retry.
    """
    reconnect = Reconnect(what, using=using)
    while True:
        try:
            result = call()
        except Exception as exc:
            if not connection_lost(exc) or connections[using or alias()].in_atomic_block:
                raise
            delay = reconnect.failed(exc)
            if wait(delay) if wait is not None else _sleep(delay):
                raise
            continue
        reconnect.succeeded()
        return result


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)  # a thread without a stop event backing off: nothing to wake it
    return False


def planner_rows(conn: BaseDatabaseWrapper, sql: str, params: Sequence[Any] = ()) -> int | None:
    """The planner's estimate of the rows ``sql`` returns, without running it (``EXPLAIN``).

    For counts that must stay cheap on big tables (the admin's changelist, the metrics
    view): PostgreSQL from its statistics, MySQL/MariaDB from index dives or InnoDB's
    statistics. None on SQLite, which keeps no estimate.
    """
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
            if isinstance(plan, str):  # pragma: no cover - psycopg returns it parsed
                import json

                plan = json.loads(plan)
            return int(plan[0]["Plan"]["Plan Rows"])
        if conn.vendor == "mysql":
            cursor.execute(f"EXPLAIN {sql}", params)
            names = [column[0].lower() for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            return max((int(row["rows"] or 0) for row in rows), default=0)
    return None


#: The PostgreSQL channel on which new or newly due work is announced; the payload is the topic.
NOTIFY_CHANNEL = "tasks_coord"


_local_listeners: list[Callable[[str], None]] = []
_local_lock = threading.Lock()


def add_local_listener(wake: Callable[[str], None]) -> None:
    """Have :func:`notify` call ``wake(topic)`` in this process where there is no ``NOTIFY``."""
    with _local_lock:
        _local_listeners.append(wake)


def remove_local_listener(wake: Callable[[str], None]) -> None:
    """Undo :func:`add_local_listener` (nothing if ``wake`` was not added)."""
    with _local_lock:
        if wake in _local_listeners:
            _local_listeners.remove(wake)


def _wake_local(topic: str) -> None:
    with _local_lock:
        listeners = list(_local_listeners)
    for wake in listeners:
        wake(topic)


def notify(conn: BaseDatabaseWrapper, topic: str) -> None:
    """Wake sleeping nodes on PostgreSQL: ``NOTIFY`` travels with the transaction.

    PostgreSQL delivers the notification when (and only if) the surrounding
    transaction commits, so a node never wakes for a push that was rolled back.
    Other databases have no such channel; their nodes poll, except that the nodes of
    this very process (:func:`add_local_listener`) are woken when the transaction
    commits, like by a ``NOTIFY``.
    """
    if conn.vendor == "postgresql":
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, topic])
    elif _local_listeners:
        transaction.on_commit(lambda: _wake_local(topic), using=conn.alias)


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


class PendingIndex(models.Index):
    """An index over some states' rows only, as narrow as each database allows.

    By default it covers the queue's waiting rows (``state_value``, PENDING); give
    ``states`` (a set of ordinals) or ``state_below`` (every state under an ordinal)
    to cover others. PostgreSQL and SQLite get a partial index (``WHERE state = ...``):
    it holds only those rows, so its size and the cost of a lookup do not grow with
    history, and the planner cannot mistake it for an index over every row.
    MySQL/MariaDB have no partial indexes; there ``fallback_fields`` is indexed, by
    default the fields with ``state`` put after the leading one, which keeps the
    lookup a range scan of the same rows. (A plain ``Index(condition=...)`` is
    silently *not created* on MySQL.) ``fallback_columns`` instead names the columns
    to index there by their database names: for a generated column a migration adds
    on MySQL/MariaDB only, which the model does not declare (see
    :data:`django_tasks_coord.models.UNFINISHED_IDENTIFIER`).
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
        path, args, kwargs = super().deconstruct()
        for key in ("state_value", "states", "state_below", "fallback_fields", "fallback_columns"):
            if (value := getattr(self, key)) is not None:
                kwargs[key] = list(value) if isinstance(value, tuple) else value
        return path, args, kwargs

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
