"""Surviving a lost database connection: recognize it, close it, back off, try again.

Every loop of a node, the LISTEN connections (:mod:`~django_tasks_coord.db.listen`) and
the django.tasks writer go through here, so an outage costs each of them the same
waits and the same two log lines (logger ``django_tasks_coord.db``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from django.db import InterfaceError, OperationalError, connections

from django_tasks_coord.db.transactions import alias

#: The documented logger of outages (docs/reference/logging.md), whichever module of
#: :mod:`django_tasks_coord.db` reports them.
logger = logging.getLogger("django_tasks_coord.db")


#: Seconds a loop waits after its database connection broke, doubled after each failed
#: retry up to :data:`RECONNECT_MAX_DELAY` (see :class:`Reconnect`).
RECONNECT_DELAY = 0.25
#: The longest wait between two reconnection attempts: a node notices that the database is
#: back within this many seconds.
RECONNECT_MAX_DELAY = 2.0

#: MySQL/MariaDB client and server error codes that mean the connection is gone: can't
#: connect (2002, 2003), server has gone away (2006), lost connection (2013, 2055), the
#: connection was killed (1927) or timed out idle (4031), server shutting down (1053), or
#: no connection to be had: the server's or the user's connections are all taken (1040,
#: 1203).
_MYSQL_LOST_CODES = frozenset({1040, 1053, 1203, 1927, 2002, 2003, 2006, 2013, 2055, 4031})
#: PostgreSQL SQLSTATEs that mean the same: class 08 (connection exception), the server
#: shutting down (57P01 admin, 57P02 crash) or not accepting connections yet (57P03), or
#: every connection slot taken (53300, ``too_many_connections``).
_PG_LOST_STATES = ("08", "57P01", "57P02", "57P03", "53300")
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
    "too many clients",
    "too many connections",
    "remaining connection slots are reserved",
)
#: The largest exponent :attr:`Backoff.delay` doubles by: ``2.0 ** n`` overflows a float
#: past 1023, and an outage may well see a thousand failures.
_MAX_DOUBLINGS = 32


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


#: Seconds after an outage ended during which a connection found broken is taken for one
#: left over from it (a loop that was idle through it, or whose connection the server
#: terminated with the others'), not for a new outage: logged at DEBUG, unless its retry
#: fails too.
STALE_WINDOW = 60.0


class Outage:
    """The outages of the database as this process sees them: one WARNING, one INFO each.

    Every loop of a node has its own :class:`Backoff`, but they all lose their connections
    at once (a restart, ``pg_terminate_backend``). The first loop whose connection is lost
    opens the outage and logs the one WARNING; the others log at DEBUG. The first loop
    that reaches the database again closes it and logs the one INFO. A connection found
    broken within :data:`STALE_WINDOW` seconds after an outage ended was broken by it (an
    idle loop only notices at its next query): DEBUG, and only if its retry fails as well
    is it a new outage (WARNING). Thread-safe; one per process (:data:`OUTAGE`).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.since: float | None = None  # None: no outage open
        self.ended = -math.inf
        #: Outages announced so far (a WARNING each), for tests and the status of a node.
        self.count = 0

    def reset(self) -> None:
        """Forget every outage (tests; a process that starts over)."""
        with self._lock:
            self.since, self.ended, self.count = None, -math.inf, 0

    @property
    def open(self) -> bool:
        """Whether an outage is under way (announced, not yet over)."""
        return self.since is not None

    def recent(self) -> bool:
        """Whether an outage is under way or ended less than :data:`STALE_WINDOW` ago."""
        return self.since is not None or self._clock() - self.ended < STALE_WINDOW

    def lost(self, what: str, error: BaseException, delay: float, failures: int) -> None:
        """Loop ``what`` lost its connection (its ``failures``-th failure in a row) and
        retries in ``delay`` seconds."""
        now = self._clock()
        with self._lock:
            if self.since is not None:
                announce = False
            elif failures == 1 and now - self.ended < STALE_WINDOW:
                announce = False  # a connection broken by the outage that just ended
            else:
                announce, self.since = True, now
                self.count += 1
        if announce:
            logger.warning(
                "%s: the database connection was lost (%s); retrying in %ss. Every loop of "
                "this process backs off (up to %ss between tries) and one line says when the "
                "database answers again.",
                what,
                error,
                delay,
                RECONNECT_MAX_DELAY,
            )
        else:
            logger.debug("%s: the database connection was lost (%s); retrying in %ss.",
                         what, error, delay)  # fmt: skip

    def back(self, what: str, failures: int) -> None:
        """Loop ``what`` reached the database again after ``failures`` failed attempts."""
        now = self._clock()
        with self._lock:
            since, self.since = self.since, None
            if since is not None:
                self.ended = now
        if since is not None:
            logger.info(
                "%s: the database answers again, %.1fs after the connection was lost (after "
                "%s failed attempt(s) of this loop).",
                what,
                now - since,
                failures,
            )
        else:
            logger.debug("%s: the database answers again (after %s failed attempt(s)).",
                         what, failures)  # fmt: skip


#: This process's :class:`Outage`: every :class:`Backoff` reports to it.
OUTAGE = Outage()


class Backoff:
    """The waits of one loop through an outage.

    :meth:`failed` returns how long to wait before trying again: ``first``
    (:data:`RECONNECT_DELAY`), doubled after each further failure up to ``cap``
    (:data:`RECONNECT_MAX_DELAY`); :meth:`succeeded` resets it. A lost connection is
    reported to the process's :class:`Outage` (:data:`OUTAGE`), so that an outage costs
    the whole process one WARNING and one INFO, however many loops and tries it took.
    Another database error (a deadlock, a failed statement) is the loop's own: its first
    failure in a row is a WARNING, the others DEBUG, and its end an INFO. For a connection
    of the loop's own (LISTEN); a loop on Django's connection uses :class:`Reconnect`.
    """

    def __init__(
        self,
        what: str,
        *,
        first: float | None = None,
        cap: float | None = None,
        outage: Outage | None = None,
    ) -> None:
        self.what = what
        self.first = RECONNECT_DELAY if first is None else first
        self.cap = max(RECONNECT_MAX_DELAY if cap is None else cap, self.first)
        self.outage = OUTAGE if outage is None else outage
        self.failures = 0
        self._since = 0.0
        self._own = False  # whether this loop logged a WARNING of its own (not an outage)

    @property
    def delay(self) -> float:
        """Seconds to wait after the latest failure."""
        if not self.failures:
            return 0.0
        return min(self.first * 2.0 ** min(self.failures - 1, _MAX_DOUBLINGS), self.cap)

    def failed(self, error: BaseException) -> float:
        """One more failure: return the seconds to wait before retrying."""
        self.failures += 1
        if self.failures == 1:
            self._since = time.monotonic()
        if connection_lost(error):
            self.outage.lost(self.what, error, self.delay, self.failures)
        elif not self._own:
            self._own = True
            logger.warning(
                "%s: a database error (%s); retrying in %ss.", self.what, error, self.delay
            )
        else:
            logger.debug("%s: still failing (%s); retrying in %ss.", self.what, error, self.delay)
        return self.delay

    def succeeded(self) -> None:
        """The loop reached the database again."""
        if self.failures:
            self.outage.back(self.what, self.failures)
            if self._own:
                logger.info(
                    "%s: the database answers again (after %s failed attempt(s), %.1fs).",
                    self.what,
                    self.failures,
                    time.monotonic() - self._since,
                )
        self.failures = 0
        self._own = False


class Reconnect(Backoff):
    """The back-off of one loop on Django's connection to ``using``: close, wait, go on.

    Like :class:`Backoff`, and :meth:`failed` first closes the thread's connection
    (:func:`reset_connection`): Django never replaces a broken one outside a request.
    """

    def __init__(
        self,
        what: str,
        *,
        first: float | None = None,
        cap: float | None = None,
        using: str | None = None,
        outage: Outage | None = None,
    ) -> None:
        super().__init__(what, first=first, cap=cap, outage=outage)
        self.using = using

    def failed(self, error: BaseException) -> float:
        """One more failure: close the connection; return the seconds to wait before retrying."""
        reset_connection(self.using)
        return super().failed(error)


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


def wait_for_database(
    what: str, *, stopped: Callable[[], bool], sleep: Callable[[float], object] = time.sleep
) -> bool:
    """Connect to the app's database, trying again after :class:`Reconnect`'s back-off for
    as long as the server is unreachable; True once it answers, False if ``stopped()``.

    For a process starting while the database is down (a restart, a deployment that
    starts everything at once): it waits, logging one WARNING (``what``: waiting for the
    database...) and one INFO when the database answers, instead of dying with a
    traceback. ``stopped()`` is checked at least every 0.1 s of a wait. An error that is not
    a lost connection (a wrong password, a database that does not exist) is raised.
    """
    reconnect = Reconnect(what)
    while not stopped():
        try:
            connections[alias()].ensure_connection()
        except Exception as exc:
            if not connection_lost(exc):
                raise
            deadline = time.monotonic() + reconnect.failed(exc)
            while not stopped() and (left := deadline - time.monotonic()) > 0:
                sleep(min(left, 0.1))
            continue
        reconnect.succeeded()
        return True
    return False


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)  # a thread without a stop event backing off: nothing to wake it
    return False
