"""The workers' database connections: kept from task to task while work is queued, closed
once the worker goes idle, dropped at once when a task left one unusable."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.signals import connection_created

from django_tasks_coord.node.pool import Job, WorkerPool

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """Names of the threads that open a database connection during the test."""
    names: list[str] = []

    def record(sender, connection, **kwargs) -> None:  # type: ignore[no-untyped-def]
        names.append(threading.current_thread().name)

    connection_created.connect(record, weak=False)
    yield names
    connection_created.disconnect(record)


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    pool = WorkerPool(1)
    yield pool
    pool.stop()


def _query() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _run_queued(pool: WorkerPool, calls: list[Callable[[], None]]) -> None:
    """Queue ``calls`` while the only worker is held, then let it run them all."""
    go, finished = threading.Event(), threading.Event()
    pool.submit(Job(lambda: go.wait(10)))
    for call in calls:
        pool.submit(Job(call))
    pool.submit(Job(finished.set))
    go.set()
    assert finished.wait(30)


def test_tasks_queued_back_to_back_share_one_connection_closed_once_idle(pool, opened):
    assert connection.settings_dict["CONN_MAX_AGE"] == 0  # Django's default
    used: list[object] = []

    def use() -> None:
        _query()
        used.append(connections[DEFAULT_DB_ALIAS])  # the worker thread's own

    _run_queued(pool, [use] * 5)
    assert opened == ["worker-1"]  # one connection, not one per task
    assert len(set(map(id, used))) == 1
    worker_connection = used[0]
    deadline = time.monotonic() + 10
    while worker_connection.connection is not None and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)
    assert worker_connection.connection is None  # type: ignore[attr-defined]


def test_a_connection_a_task_left_unusable_is_not_handed_to_the_next(pool, opened):
    autocommit: list[bool] = []

    def leave_autocommit_off() -> None:
        _query()
        connection.set_autocommit(False)

    def check() -> None:
        _query()
        autocommit.append(connection.get_autocommit())

    _run_queued(pool, [leave_autocommit_off, check])
    assert autocommit == [True]
    assert opened == ["worker-1", "worker-1"]  # the first one was dropped
