"""The HTTP API's database threads: a few long-lived threads that do every API call's database
work when the API is served beside Django's request handling (:mod:`~django_tasks_coord.api.asgi`),
and every long-poll's checks.

Django's database connections belong to a thread. Under ASGI, Django runs each request's
synchronous code in a thread of that request's own, so a connection cannot outlive its
request there, whatever ``CONN_MAX_AGE`` says. These threads live as long as the process:
each keeps its connections between calls the way Django keeps a WSGI worker's, by the
``DATABASES`` settings:

- before and after each call, a connection that is broken, or older than ``CONN_MAX_AGE``,
  is closed (``CONN_MAX_AGE = 0``, Django's default: after every call, as Django does after
  every request);
- with ``CONN_HEALTH_CHECKS``, a connection kept from an earlier call is checked before its
  first use in the next one.

So an API process holds at most ``API_THREADS`` connections of its own, however many executors
call it or wait in long-polls (plus, on PostgreSQL, one ``LISTEN`` connection); a waiting
long-poll holds none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_tasks_coord.conf import app_settings

__all__ = ["close", "run_db"]

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
#: The connections each database thread opened (by thread id), for :func:`close`.
_opened: dict[int, list[BaseDatabaseWrapper]] = {}


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=int(app_settings.API_THREADS), thread_name_prefix="tasks-coord-api"
            )
        return _pool


def _close_old() -> None:
    """What Django does at each request's start and end: close the connections that are
    broken or past ``CONN_MAX_AGE``, and have the others health-checked on next use."""
    for conn in connections.all(initialized_only=True):
        conn.close_if_unusable_or_obsolete()


def _call[T](func: Callable[..., T], args: tuple[Any, ...]) -> T:
    _close_old()
    try:
        return func(*args)
    finally:
        _close_old()
        opened = [conn for conn in connections.all(initialized_only=True) if conn.connection]
        with _lock:
            _opened[threading.get_ident()] = opened


async def run_db[T](func: Callable[..., T], *args: Any) -> T:
    """Run ``func(*args)`` in one of the API's database threads and return what it returns."""
    return await sync_to_async(_call, thread_sensitive=False, executor=_threads())(func, args)


def close() -> None:
    """Close the database threads' connections and end the threads (new ones start with the
    next call). For tests and orderly shutdowns."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True)
    with _lock:
        opened = [conn for conns in _opened.values() for conn in conns]
        _opened.clear()
    for conn in opened:
        conn.inc_thread_sharing()  # the thread that opened it is gone
        try:
            conn.close()
        finally:
            conn.dec_thread_sharing()
