"""The connections the executor's calls keep: with persistent connections configured
(CONN_MAX_AGE), the API's database threads keep theirs between calls, and only then."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections
from django.db.backends.signals import connection_created
from django.test import Client, override_settings

from django_tasks_coord import executions
from django_tasks_coord.api import threads
from tests.api.conftest import Api, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def executor(transactional_db) -> Api:
    return Api(make_user("executor", "execute_tasks")[1], Client())


@contextmanager
def database_threads(size: int, conn_max_age: int | None) -> Iterator[None]:
    """The API's database threads anew, ``size`` of them, their connections kept for
    ``conn_max_age`` seconds (0: closed after each call; None: for good)."""
    config = connections.settings["default"]
    before = config["CONN_MAX_AGE"]
    threads.close()
    config["CONN_MAX_AGE"] = conn_max_age
    try:
        with override_settings(TASKS_COORD={"API_THREADS": size}):
            yield
    finally:
        threads.close()
        config["CONN_MAX_AGE"] = before


def connections_opened(api: Api, calls: int) -> int:
    """How many database connections ``calls`` claims (each in the database threads) open."""
    opened: list[object] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(connection)

    connection_created.connect(count)
    try:
        for _ in range(calls):
            api.ok("POST", "claim", {"definitions": ["test/basic"]})
    finally:
        connection_created.disconnect(count)
    return len(opened)


@pytest.mark.parametrize(("conn_max_age", "kept"), [(None, True), (60, True), (0, False)])
def test_the_database_threads_keep_their_connections_by_conn_max_age(executor, conn_max_age, kept):
    for _ in range(6):
        executions.create("test/basic")
    with database_threads(2, conn_max_age):
        opened = connections_opened(executor, 6)
    # Each claim is one call into the threads: the token's check, then the claim.
    assert opened <= 2 if kept else opened == 6
