"""Long-polls that cost neither a thread nor a database connection while they wait.

A waiting long-poll is a coroutine parked on an :class:`asyncio.Event`. Each check for
work runs in one of the API's few database threads (:mod:`~django_tasks_coord.api.threads`),
which keep their connections by the ``DATABASES`` settings, so a thousand waiting executors
hold a thousand small coroutines, not a thousand threads or connections (deploy under
ASGI; see docs/executors.md).

What wakes a waiting long-poll:

- on PostgreSQL (with ``LISTEN_NOTIFY`` on), a ``NOTIFY`` on the queue's channel for one of its definitions (a new
  task, a retry, a task back from a timeout, a freed concurrency slot). One ``LISTEN``
  connection per event loop (per server process) serves every waiter; it closes a
  little while after the last waiter left, and it reconnects after a loss like every
  LISTEN connection of the package (:class:`~django_tasks_coord.db.Listening`);
- the moment the next waiting task of its definitions becomes due (``execute_at``, a
  retry delay), which no notification announces;
- the moment the rate window of a definition's topic that held its last check back
  (:func:`~django_tasks_coord.store.flow.held_back_until`) moves on, at least
  :data:`~django_tasks_coord.store.flow.RECHECK_AFTER` after that check (the moment may have passed by the time the check
  returns); only a moment noted by that check counts, not an old one of a topic unlimited
  since;
- elsewhere, or while the ``LISTEN`` connection is not up, a check every
  ``LONG_POLL_INTERVAL`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.db import DatabaseError

from django_tasks_coord import db, executions
from django_tasks_coord.api.threads import run_db
from django_tasks_coord.conf import app_settings
from django_tasks_coord.models import Task
from django_tasks_coord.store import flow as flow_claims

#: With LISTEN up, a waiting long-poll still checks this often (belt and braces).
SAFETY_INTERVAL = 10.0
#: Seconds the LISTEN connection stays open after its last waiter left.
LINGER = 30.0


class _Hub:
    """The waiters of one event loop by topic, and (PostgreSQL) the LISTEN connection waking them.

    The connection follows the package's one LISTEN policy (:class:`~django_tasks_coord.db.Listening`):
    reconnected with the back-off of a node's loops while waiters are left, closed
    :data:`LINGER` seconds after the last one left.
    """

    def __init__(self) -> None:
        self.waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._listening = db.Listening(
            "Long-poll LISTEN (waiting long-polls check every LONG_POLL_INTERVAL meanwhile)"
        )
        self._listener: asyncio.Task[None] | None = None

    @property
    def listening(self) -> bool:
        """Whether notifications arrive now (else waiters check every ``LONG_POLL_INTERVAL``)."""
        return self._listening.up.is_set()

    def subscribe(self, topics: Sequence[str]) -> asyncio.Event:
        event = asyncio.Event()
        for topic in topics:
            self.waiters[topic].add(event)
        if (
            (self._listener is None or self._listener.done())
            and app_settings.LISTEN_NOTIFY
            and db.supports_listen(db.alias())
        ):
            self._listener = asyncio.get_running_loop().create_task(self._listen())
        return event

    def unsubscribe(self, topics: Sequence[str], event: asyncio.Event) -> None:
        for topic in topics:
            waiting = self.waiters.get(topic)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self.waiters[topic]

    def wake(self, topic: str) -> None:
        for event in self.waiters.get(topic, ()):
            event.set()

    async def _listen(self) -> None:
        await self._listening.arun(self._serve, stopped=lambda: not self.waiters)

    async def _serve(self, conn: Any) -> None:
        """Wake the waiters of each notification's topic until :data:`LINGER` seconds without any."""
        loop = asyncio.get_running_loop()
        idle_since: float | None = None
        while True:
            async for notification in conn.notifies(timeout=1.0):
                self.wake(notification.payload)
            if self.waiters:
                idle_since = None
            elif idle_since is None:
                idle_since = loop.time()
            elif loop.time() - idle_since > LINGER:
                return


#: An attempt to claim: the tasks it got, and when the next waiting task falls due.
Attempt = tuple[list[Task], datetime | None]

_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Hub] = weakref.WeakKeyDictionary()


def _hub() -> _Hub:
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = _Hub()
    return hub


def _check(
    names: Sequence[str],
    limit: int,
    authorize: Callable[[], object] | None,
    start: bool = False,
    wait: bool = True,
) -> Attempt:
    """One attempt to claim: the tasks, and (when none came and ``wait``) when the next
    waiting one falls due."""
    if authorize is None:
        tasks = executions.poll(names, limit, start=start)
    else:
        try:
            with db.write_transaction():
                authorize()  # raises if the token was revoked meanwhile: it claims nothing
                tasks = executions.poll(names, limit, start=start)
                if tasks:
                    # Revoked between the check and the claim: the tasks may have been
                    # created after the revocation, so the claim is rolled back.
                    authorize()
        except Exception as exc:
            if not isinstance(exc, DatabaseError):
                for name in names:  # pollers that skipped the rows this claim held
                    db.notify(db.connection(), name)
            raise
    return tasks, (executions.next_due(names) if wait and not tasks else None)


def first_attempt(names: Sequence[str], limit: int, timeout: float, start: bool) -> Attempt:
    """A long-poll's first attempt to claim, made by the caller right after it checked the
    token (pass it to :func:`long_poll` as ``first``)."""
    return _check(names, limit, None, start, wait=False)


async def long_poll(
    names: Sequence[str],
    limit: int,
    timeout: float,
    *,
    authorize: Callable[[], object] | None = None,
    start: bool = False,
    first: Attempt | None = None,
) -> list[Task]:
    """Poll the definitions ``names`` until tasks come or ``timeout`` seconds passed.

    ``timeout`` is capped by ``LONG_POLL_MAX_TIMEOUT`` (0: one attempt, no wait). Returns
    the tasks handed out (REQUESTED, with their exec_ids; with ``start``, IN PROGRESS), or
    ``[]`` after the timeout. ``first`` is an attempt the caller made already
    (:func:`first_attempt`): its tasks are returned at once; if it got none, the wait
    begins with another attempt (a task created between the two is not missed).
    ``authorize`` runs (in the database thread) before each attempt after a wait (the
    caller checked before the first ones), and again once such an attempt got tasks, in the
    claim's transaction: what it raises ends the wait and propagates, and the claim is
    rolled back.
    """
    if first is None:
        first = await run_db(_check, names, limit, None, start, False)
    if first[0] or timeout <= 0:
        return first[0]
    loop = asyncio.get_running_loop()
    end = loop.time() + min(timeout, float(app_settings.LONG_POLL_MAX_TIMEOUT))
    interval = float(app_settings.LONG_POLL_INTERVAL)
    hub = _hub()
    event = hub.subscribe(names)
    check: Callable[[], object] | None = None  # no wait since the caller's check
    try:
        while True:
            event.clear()  # before the check: a NOTIFY during it is not lost
            notified = hub.listening
            looked = time.monotonic()
            tasks, due = await run_db(_check, names, limit, check, start)
            check = authorize
            remaining = end - loop.time()
            if tasks or remaining <= 0:
                return tasks
            wait = min(remaining, SAFETY_INTERVAL if notified else interval)
            if due is not None:
                wait = min(wait, max((due - executions.clock()).total_seconds(), 0.0) + 0.001)
            # A rate window moves on then: a moment this check noted, even if past by now.
            held = flow_claims.next_look(list(names), since=looked)
            if held is not None:
                wait = min(wait, held + 0.001)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), wait)
    finally:
        hub.unsubscribe(names, event)
