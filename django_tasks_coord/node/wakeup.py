"""Waking a sleeping node: PostgreSQL LISTEN/NOTIFY, or plain timeouts elsewhere."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from django_tasks_coord.db import NOTIFY_CHANNEL, Reconnect

logger = logging.getLogger(__name__)


class Listener(threading.Thread):
    """Listens on PostgreSQL's ``tasks_coord`` channel and calls ``wake(topic)`` for each notification.

    It uses a connection of its own (autocommit), opened with the same parameters as
    the app's database alias. If the connection breaks it reconnects with the back-off
    of every loop of a node (:class:`~django_tasks_coord.db.Reconnect`); meanwhile the
    node polls every ``POLL_INTERVAL``, so work is only later, never lost.
    """

    def __init__(self, alias: str, wake: Callable[[str], None], stopping: threading.Event) -> None:
        super().__init__(name="listener", daemon=True)
        self.alias = alias
        self.wake = wake
        self.stopping = stopping
        self.listening = threading.Event()

    def run(self) -> None:
        import psycopg

        reconnect = Reconnect("LISTEN (the node polls every POLL_INTERVAL meanwhile)")
        params = listen_params(self.alias)
        while not self.stopping.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self.listening.set()
                    reconnect.succeeded()
                    logger.debug("Listening for notifications on %r.", NOTIFY_CHANNEL)
                    while not self.stopping.is_set():
                        for notification in conn.notifies(timeout=0.5):
                            self.wake(notification.payload)
            except Exception as exc:  # noqa: BLE001 - reconnect on any failure
                self.listening.clear()
                self.stopping.wait(reconnect.failed(exc))
        self.listening.clear()


def listen_params(alias: str) -> dict[str, Any]:
    """Arguments for ``psycopg.connect`` to the database behind ``alias``, for a LISTEN connection
    of its own (Django's cursor factory and adaptation context left out)."""
    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def listen_supported(alias: str) -> bool:
    """Whether the database behind ``alias`` can wake nodes (PostgreSQL with psycopg 3)."""
    if connections[alias].vendor != "postgresql":
        return False
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return True
