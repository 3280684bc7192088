"""One policy for every LISTEN connection: the node's wake-ups and the HTTP API's long-polls.

A LISTEN connection is a psycopg 3 connection of its own (autocommit), opened with the
parameters of a database alias (:func:`listen_params`; by default :func:`listen_alias`,
``TASKS_COORD["LISTEN_DATABASE"]`` or else the app's alias), listening on
:data:`~django_tasks_coord.db.NOTIFY_CHANNEL`. :class:`Listening` connects, listens,
hands the connection to its user's ``serve`` (which reads the notifications), and when
the connection breaks waits like every loop of a node (:class:`~django_tasks_coord.db.Backoff`:
0.25 s doubling up to 2 s, one WARNING per outage and one INFO when the database answers
again, logger ``django_tasks_coord.db``) and connects again. Its :attr:`~Listening.up`
event tells the user whether notifications arrive now; while they do not, the user
polls, so work is only later, never lost.

The node serves it from a thread (:meth:`Listening.run`), the long-polls from their
event loop (:meth:`Listening.arun`). Whether there is anything to listen to at all:
:func:`~django_tasks_coord.db.supports_listen`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_tasks_coord.conf import app_settings
from django_tasks_coord.db.notifications import NOTIFY_CHANNEL
from django_tasks_coord.db.reconnect import Backoff
from django_tasks_coord.db.transactions import alias

if TYPE_CHECKING:
    import psycopg


def listen_alias() -> str:
    """The database alias LISTEN connections are opened with.

    ``TASKS_COORD["LISTEN_DATABASE"]`` if set: an alias that reaches the app's database
    directly while :func:`~django_tasks_coord.db.alias` goes through a pooler in
    transaction mode (PgBouncer), where a LISTEN would be lost with the server connection
    it ran on. Otherwise the app's alias.
    """
    return str(app_settings.LISTEN_DATABASE or alias())


def listen_params(using: str) -> dict[str, Any]:
    """Arguments for ``psycopg.connect`` to the database behind ``using``, for a LISTEN connection
    of its own (Django's cursor factory and adaptation context left out)."""
    params = connections[using].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


class Listening:
    """The life of one LISTEN connection: connect, LISTEN, serve, and on loss back off and reconnect.

    ``what`` names it in the log lines of an outage (say what its user does meanwhile).
    ``using`` is the database alias (default: :func:`listen_alias`, read at each connection).
    ``serve(conn)`` reads the connection's notifications for as long as its user wants
    them; when it returns, the connection is closed and :meth:`run` / :meth:`arun`
    return. When it raises (the connection broke), the back-off starts.
    """

    def __init__(self, what: str, *, using: str | None = None) -> None:
        self.using = using
        #: Set while the connection is up and listening: notifications arrive.
        self.up = threading.Event()
        self._backoff = Backoff(what)
        self._statement = f"LISTEN {NOTIFY_CHANNEL}"

    def _params(self) -> dict[str, Any]:
        return listen_params(self.using or listen_alias())

    def _failed(self, error: BaseException) -> float:
        self.up.clear()
        return self._backoff.failed(error)

    def _listening(self) -> None:
        self.up.set()
        self._backoff.succeeded()

    def run(
        self,
        serve: Callable[[psycopg.Connection[Any]], object],
        *,
        stopped: Callable[[], bool],
        wait: Callable[[float], object],
    ) -> None:
        """Serve LISTEN connections in this thread until ``serve`` returns or ``stopped()``.

        ``wait(seconds)`` sleeps between two attempts (it should wake up early when the
        user stops, for instance ``Event.wait``).
        """
        import psycopg  # the optional postgres extra: only where supports_listen() is True

        try:
            while not stopped():
                try:
                    with psycopg.connect(**self._params(), autocommit=True) as conn:
                        conn.execute(self._statement)
                        self._listening()
                        serve(conn)
                        return
                except Exception as exc:  # noqa: BLE001 - reconnect on any failure
                    wait(self._failed(exc))
        finally:
            self.up.clear()

    async def arun(
        self,
        serve: Callable[[psycopg.AsyncConnection[Any]], Awaitable[object]],
        *,
        stopped: Callable[[], bool],
    ) -> None:
        """:meth:`run` in an event loop: ``serve`` is a coroutine function, waits are
        ``asyncio.sleep``."""
        import psycopg  # the optional postgres extra: only where supports_listen() is True

        try:
            while not stopped():
                try:
                    async with await psycopg.AsyncConnection.connect(
                        **self._params(), autocommit=True
                    ) as conn:
                        await conn.execute(self._statement)
                        self._listening()
                        await serve(conn)
                        return
                except Exception as exc:  # noqa: BLE001 - reconnect on any failure
                    await asyncio.sleep(self._failed(exc))
        finally:
            self.up.clear()
