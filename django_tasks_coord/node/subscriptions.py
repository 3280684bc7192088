"""Which duty a wake-up concerns: a table from NOTIFY payloads (topics, events) to callbacks.

A node is woken by NOTIFY payloads (PostgreSQL) or by this process's own commits
(:func:`django_tasks_coord.db.add_local_listener`): a topic name (a task was pushed), or
an event under a reserved prefix (a topic resumed, a token released, a schedule changed).
Each duty subscribes to what concerns it; :meth:`Subscriptions.publish` calls the
callbacks of an exact match, else of the first matching prefix, else the catch-all ones.
"""

from __future__ import annotations

from collections.abc import Callable

Callback = Callable[[str], None]


class Subscriptions:
    """The subscription table of one node (see the module)."""

    def __init__(self) -> None:
        self._exact: dict[str, list[Callback]] = {}
        self._prefixes: list[tuple[str, list[Callback]]] = []
        self._others: list[Callable[[str | None], None]] = []

    def subscribe(self, payload: str, callback: Callback) -> None:
        """Call ``callback(payload)`` on exactly ``payload``."""
        self._exact.setdefault(payload, []).append(callback)

    def subscribe_prefix(self, prefix: str, callback: Callback) -> None:
        """Call ``callback(payload)`` on each payload that starts with ``prefix``."""
        for known, callbacks in self._prefixes:
            if known == prefix:
                callbacks.append(callback)
                return
        self._prefixes.append((prefix, [callback]))

    def subscribe_others(self, callback: Callable[[str | None], None]) -> None:
        """Call ``callback(payload)`` on any other payload (None: "look at everything")."""
        self._others.append(callback)

    def publish(self, payload: str | None) -> None:
        """Call the callbacks ``payload`` concerns (see the module)."""
        if payload is not None:
            if payload in self._exact:
                for callback in self._exact[payload]:
                    callback(payload)
                return
            for prefix, callbacks in self._prefixes:
                if payload.startswith(prefix):
                    for callback in callbacks:
                        callback(payload)
                    return
        for other in self._others:
            other(payload)
