"""Waking a sleeping node: PostgreSQL LISTEN/NOTIFY, or plain timeouts elsewhere.

The LISTEN connection itself (connect, back-off, reconnect) is :mod:`django_tasks_coord.db.listen`'s.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Callable
from typing import Any

from django_tasks_coord.db import NOTIFY_CHANNEL, Listening, listen_params, supports_listen

logger = logging.getLogger(__name__)

__all__ = ["Listener", "StopEvent", "WakeEvent", "listen_params", "listen_supported"]


class Listener(threading.Thread):
    """Listens on PostgreSQL's ``tasks_coord`` channel and calls ``wake(topic)`` for each notification.

    Its connection follows the one LISTEN policy of the package
    (:class:`~django_tasks_coord.db.Listening`): a connection of its own (autocommit),
    opened with the same parameters as the app's database alias, reconnected with the
    back-off of every loop of a node when it breaks; meanwhile the node polls every
    ``POLL_INTERVAL``, so work is only later, never lost. :attr:`listening` is set while
    notifications arrive. It sleeps on its connection's socket and on a socket pair that
    a stop request writes to, so it ends at once when the node stops.
    """

    def __init__(self, alias: str, wake: Callable[[str], None], stopping: StopEvent) -> None:
        super().__init__(name="listener", daemon=True)
        self.alias = alias
        self.wake = wake
        self.stopping = stopping
        self._policy = Listening(
            "LISTEN (the node polls every POLL_INTERVAL meanwhile)", using=alias
        )
        self.listening = self._policy.up
        self._interrupt_r, self._interrupt_w = socket.socketpair()
        self._interrupt_w.setblocking(False)
        stopping.on_set(self._interrupt)

    def _interrupt(self) -> None:
        with contextlib.suppress(OSError):  # buffer full: it is woken already
            self._interrupt_w.send(b"!")

    def _sleep(self, conn: Any) -> None:
        """Block until the LISTEN connection has input or the node stops."""
        select.select([conn.fileno(), self._interrupt_r], [], [])

    def _serve(self, conn: Any) -> None:
        """Wake the node for each notification until it stops."""
        logger.debug("Listening for notifications on %r.", NOTIFY_CHANNEL)
        while not self.stopping.is_set():
            for notification in conn.notifies(timeout=0):  # what has arrived
                self.wake(notification.payload)
            self._sleep(conn)

    def run(self) -> None:
        try:
            self._policy.run(self._serve, stopped=self.stopping.is_set, wait=self.stopping.wait)
        finally:
            self.stopping.remove(self._interrupt)
            self._interrupt_r.close()
            self._interrupt_w.close()


#: Whether the database behind an alias can wake nodes (PostgreSQL with psycopg 3); the
#: node's name for :func:`django_tasks_coord.db.supports_listen`.
listen_supported = supports_listen


class StopEvent(threading.Event):
    """A node's stop request: an event that also wakes every wait registered with :meth:`on_set`.

    Each loop of a node sleeps on something of its own (a :class:`WakeEvent`, a socket,
    a queue); whatever it sleeps on registers here how to interrupt it, so that a stop
    request ends every wait at once rather than at the wait's timeout.
    """

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()

    def on_set(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (it must be quick and must not block) when the event is set;
        at once if it is set already."""
        with self._callbacks_lock:
            self._callbacks.append(callback)
        if self.is_set():
            callback()

    def remove(self, callback: Callable[[], None]) -> None:
        """Undo :meth:`on_set` (a wait that no longer exists)."""
        with self._callbacks_lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def set(self) -> None:
        """Set the event, then interrupt every registered wait."""
        super().set()
        with self._callbacks_lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback()


class WakeEvent:
    """An event a loop sleeps on (``wait(timeout)``), set for good once ``stop`` is set.

    Like :class:`threading.Event`, except that :meth:`clear` does nothing once the node is
    stopping: a loop that clears its wake-up event just after a stop request cannot miss
    it and sleep for a whole timeout.
    """

    def __init__(self, stop: StopEvent) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._flag = False
        self._stop = stop
        stop.on_set(self.set)

    def is_set(self) -> bool:
        """Whether the event is set."""
        return self._flag

    def set(self) -> None:
        """Set the event: wake the waiting loop."""
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def clear(self) -> None:
        """Reset the event, unless the node is stopping (then it stays set)."""
        with self._cond:
            if not self._stop.is_set():
                self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the event is set or ``timeout`` seconds passed; return the flag."""
        with self._cond:
            if not self._flag:
                self._cond.wait_for(lambda: self._flag, timeout)
            return self._flag
