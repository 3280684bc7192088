"""What each executor call costs the database, and the connections it keeps.

Statements per call, counted with CaptureQueriesContext in this thread and in the API's
database threads (where long-polls and claims run), transactions' BEGIN and COMMIT included:
the token and its permission are one query, a PostgreSQL poll or claim is one more, and the
other calls lock their rows and write them in one transaction. With persistent connections
configured (CONN_MAX_AGE), the database threads keep theirs between calls, and only then.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections
from django.db.backends.signals import connection_created
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

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


@contextmanager
def statements() -> Iterator[list[str]]:
    """The SQL run meanwhile, here and in the API's database threads (savepoints aside: the
    transactional test runs none, the in-process client's thread may)."""
    captured: list[str] = []
    call = threads._call

    def counting(func: Any, args: tuple[Any, ...]) -> Any:
        with CaptureQueriesContext(connections["default"]) as queries:
            try:
                return call(func, args)
            finally:
                captured.extend(query["sql"] for query in queries.captured_queries)

    threads._call = counting
    try:
        with CaptureQueriesContext(connection) as here:
            yield captured
        captured.extend(query["sql"] for query in here.captured_queries)
    finally:
        threads._call = call


def cost(api: Api, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    with statements() as sql:
        answer = api.ok("POST", path, body)
    return len(sql), answer


#: Statements per call, by database. The token's query, then: on PostgreSQL, the poll or
#: claim itself (UPDATE ... RETURNING); elsewhere and for the other calls, BEGIN, the locking
#: SELECT, the UPDATE and COMMIT. SQLite takes its write lock first (db.serialize_claims).
EXPECTED = {
    "postgresql": {"poll": 2, "start": 5, "success": 5, "claim": 2, "complete": 5},
    "mysql": {"poll": 5, "start": 5, "success": 5, "claim": 5, "complete": 5},
    "sqlite": {"poll": 6, "start": 6, "success": 6, "claim": 6, "complete": 6},
}


def test_each_executor_call_costs_the_token_query_and_its_own_statements(executor):
    for _ in range(12):
        executions.create("test/basic")
    with database_threads(1, None):
        executor.ok("POST", "claim", {"definitions": ["test/basic"]})  # connected, synced
        counts: dict[str, int] = {}
        counts["poll"], polled = cost(executor, "poll", {"definitions": ["test/basic"]})
        (task,) = polled["tasks"]
        execution = {"exec_id": task["exec_id"]}
        counts["start"], _ = cost(executor, f"{task['id']}/start", execution)
        counts["success"], _ = cost(executor, f"{task['id']}/success", {**execution, "result": 1})
        claim = {"definitions": ["test/basic"], "limit": 8}
        counts["claim"], claimed = cost(executor, "claim", claim)
        reports = [
            {"id": t["id"], "exec_id": t["exec_id"], "outcome": "succeeded", "result": {"n": i}}
            for i, t in enumerate(claimed["tasks"])
        ]
        counts["complete"], completed = cost(executor, "complete", {"tasks": reports})
    assert len(reports) == 8
    assert all(result["ok"] for result in completed["results"])
    assert counts == EXPECTED[connection.vendor]


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
