"""The claim, the reaper and the admin's task list stay index-driven on a big task table.

PostgreSQL only. A representative data set (200,000 completed tasks over six topics,
3,000 pending, built with ``generate_series`` and analyzed inside the test's
transaction) stands in for a big history; the SQL the product really runs is captured
(``CaptureQueriesContext`` around ``queue.poll``, ``queue.complete_many``,
``owners.expire``, ``executions.reap`` and the admin's task changelist) and explained.
No plan may read the task table, or one of its partitions, with a ``Seq Scan`` (the
planner picks one when no index serves the query), nor read more than ``READ_LIMIT``
rows of it with any scan (see :func:`problems`). A relation with fewer than
``SMALL_ROWS`` rows (an empty or tiny partition) read whole is no scale problem and is
allowed. ``benchmarks/scale.py`` reports the same plans at 10 million rows.

Plans, not times, are asserted: the result does not depend on the machine's load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_tasks_coord import definitions, executions, owners, queue
from django_tasks_coord.models import Owner, Task

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="plans of PostgreSQL (generate_series)"
    ),
    pytest.mark.django_db,
]

TOPICS = [f"plans-{k}" for k in range(6)]
CLAIM_TOPIC = TOPICS[0]
EXEC = "plans-exec"
COMPLETED = 200_000
PENDING = 3_000
SMALL_ROWS = 10_000
#: No scan of the task table may read more rows (the admin's capped count reads 10,001).
READ_LIMIT = 20_000
ADMIN_URL = "/admin/django_tasks_coord/task/"
ADMIN_CASES = {
    "unfiltered": {},
    "state = failed": {"state__exact": "43"},
    "state = pending": {"state__exact": "10"},
    "one topic": {"topic__name__exact": TOPICS[3]},
    "one topic, state = pending": {"topic__name__exact": CLAIM_TOPIC, "state__exact": "10"},
}


def sql(statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])
        return list(cursor.fetchall()) if cursor.description else []


def build(completed: int = COMPLETED, pending: int = PENDING) -> None:
    """Fill the task table with set-based SQL and analyze it (inside the test transaction).

    History: every topic in turn, 96 % succeeded, 3 % failed, 1 % redundant, created
    over four weeks, 50,000 identifiers. Pending: the claim topic, created now.
    """
    for name in TOPICS:
        queue.register_topic(name)  # before its tasks: a partitioned table makes its partition
    table = Task._meta.db_table
    columns = (
        "topic_id, identifier, payload, handler, state, priority, attempts, created_at, "
        "started_at, finished_at, recreated, label, requester, outcome_reason, concurrency_key"
    )
    sql(
        f"INSERT INTO {table} ({columns}) "
        f"SELECT 'plans-' || (i %% {len(TOPICS)}), 'id-' || ((i * 7919) %% 50000), "
        "jsonb_build_object('n', i), '', "
        "CASE WHEN i %% 100 < 3 THEN 43 WHEN i %% 100 = 3 THEN 45 ELSE 40 END, 0, 1, "
        "now() - interval '28 days' + i * interval '8 seconds', "
        "now() - interval '28 days' + i * interval '8 seconds' + interval '1 second', "
        "now() - interval '28 days' + i * interval '8 seconds' + interval '3 seconds', "
        "false, '', '', '', '' FROM generate_series(1, %s::bigint) AS s(i)",
        [completed],
    )
    sql(
        f"INSERT INTO {table} ({columns}) "
        f"SELECT %s, 'id-' || ((i * 7919) %% 50000), jsonb_build_object('n', i), '', 10, 0, 0, "
        "now(), NULL, NULL, false, '', '', '', '' FROM generate_series(1, %s::bigint) AS s(i)",
        [CLAIM_TOPIC, pending],
    )
    sql(f"ANALYZE {table}")


def task_relations() -> dict[str, int]:
    """The task table and its partitions (at any depth), with the planner's row counts."""
    rows = sql(
        "WITH RECURSIVE rels(oid) AS (SELECT %s::regclass::oid"
        " UNION SELECT i.inhrelid FROM pg_inherits i JOIN rels r ON i.inhparent = r.oid)"
        " SELECT c.relname, GREATEST(c.reltuples, 0)::bigint FROM rels JOIN pg_class c"
        " ON c.oid = rels.oid",
        [Task._meta.db_table],
    )
    return {name: int(n) for name, n in rows}


def scan_nodes(node: dict[str, Any], under_limit: bool = False) -> Iterator[dict[str, Any]]:
    """Every node of a JSON plan that reads a relation, with ``under_limit``: only
    pass-through nodes between it and a Limit above."""
    kind = node["Node Type"]
    if "Relation Name" in node:
        yield {**node, "under_limit": under_limit}
    passes = kind in ("Append", "LockRows", "Subquery Scan", "Result")
    for child in node.get("Plans", []):
        yield from scan_nodes(child, kind == "Limit" or (under_limit and passes))


def problems(statement: str) -> list[str]:
    """What makes ``statement``'s plan depend on the size of the task table (empty: none).

    Its plan is taken with ``EXPLAIN (ANALYZE, FORMAT JSON)`` in a savepoint that is rolled
    back. Two faults, on a relation of the task table with ``SMALL_ROWS`` rows or more:

    - a **Seq Scan**, unless it is bounded: under a LIMIT, with a filter that keeps (nearly)
      every row, so that it stops after LIMIT rows (the admin's count of one topic, capped
      at 10,001 rows, on a table partitioned by topic: the filter is the partition's topic);
    - any scan that **reads more than** ``READ_LIMIT`` rows (rows returned plus rows removed
      by its filter): an index that does not serve the query (a regression to "the topic's
      index, then filter") reads a topic's whole history without a Seq Scan node.
    """
    relations = task_relations()
    with transaction.atomic():
        plan = sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}")[0][0]
        transaction.set_rollback(True)
    found = []
    for node in scan_nodes(plan[0]["Plan"]):
        name, rows = node["Relation Name"], relations.get(node["Relation Name"], -1)
        if rows < SMALL_ROWS:
            continue
        read = (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
        keeps_all = "Filter" not in node or node["Plan Rows"] >= 0.9 * rows
        if node["Node Type"] == "Seq Scan" and not (node["under_limit"] and keeps_all):
            found.append(f"Seq Scan on {name} ({rows:,} rows)")
        elif read > READ_LIMIT:
            found.append(f"{node['Node Type']} on {name} read {read:,} rows")
    return found


def task_statements(call: Callable[[], Any]) -> tuple[Any, list[str]]:
    """Run ``call``; return its value and the SELECT/UPDATE/DELETE statements it ran on the
    task table (the admin's paginator's own ``EXPLAIN`` left out)."""
    table = Task._meta.db_table
    with CaptureQueriesContext(connection) as captured:
        value = call()
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].split(None, 1)[0].upper() in ("SELECT", "UPDATE", "DELETE", "WITH")
        and (f'FROM "{table}"' in q["sql"] or f'UPDATE "{table}"' in q["sql"])
    ]
    return value, statements


def scans_of(statements: list[str]) -> dict[str, list[str]]:
    """The statements (shortened) whose plans have :func:`problems`, with them."""
    found = {statement[:200]: problems(statement) for statement in statements}
    return {statement: scans for statement, scans in found.items() if scans}


@pytest.fixture
def exec_definition() -> Iterator[str]:
    definitions.define(EXEC, requested_to_start_timeout=60, in_progress_timeout=600)
    definitions.sync()
    yield EXEC
    definitions.forget(EXEC)


def test_claim_reaper_and_admin_use_indexes(admin_client: Client, exec_definition: str) -> None:
    build()
    statements: dict[str, list[str]] = {}

    # The claim and its completion, as a node runs them.
    owner = queue.register_owner("plans")
    tasks, statements["claim"] = task_statements(
        lambda: queue.poll(CLAIM_TOPIC, 100, owner=owner, heartbeat_owner=False)
    )
    assert len(tasks) == 100
    assert any("SKIP LOCKED" in s for s in statements["claim"])
    _, statements["complete"] = task_statements(lambda: queue.complete_many(tasks, "success"))

    # The reaper: a dead owner holding tasks, executor tasks past their deadlines.
    dead = queue.register_owner("plans-dead")
    assert len(queue.poll(CLAIM_TOPIC, 20, owner=dead)) == 20
    Owner.objects.filter(pk=dead.pk).update(heartbeat=datetime(2000, 1, 1, tzinfo=UTC))
    freed, statements["owners.expire"] = task_statements(owners.expire)
    assert len(freed) == 20
    for n in range(10):
        executions.create(exec_definition, {"n": n})
    handed = executions.poll([exec_definition], 10)
    for task in handed[:5]:
        executions.start(task.pk, task.exec_id)
    later = datetime.now(UTC) + timedelta(days=1)
    caught, statements["executions.reap"] = task_statements(lambda: executions.reap(now=later))
    assert sum(caught.values()) == 10

    # The admin's task changelist (the page and its capped count).
    for case, params in ADMIN_CASES.items():
        response, statements[f"admin: {case}"] = task_statements(
            lambda params=params: admin_client.get(ADMIN_URL, params)
        )
        assert response.status_code == 200

    assert all(statements.values()), {k: len(v) for k, v in statements.items()}
    scans = {name: scans_of(found) for name, found in statements.items()}
    assert {name: found for name, found in scans.items() if found} == {}


def test_a_missing_index_is_caught() -> None:
    """The check is not vacuous: without the indexes that serve the claim, it fails."""
    build(completed=150_000, pending=1_000)
    owner = queue.register_owner("plans")
    tasks, claim = task_statements(
        lambda: queue.poll(CLAIM_TOPIC, 10, owner=owner, heartbeat_owner=False)
    )
    assert tasks and scans_of(claim) == {}
    # Every index but the constraints' goes, inside the test's transaction (dropped on the
    # parent, a partitioned table loses its partitions' too): the claim now reads the
    # topic's whole history, with a Seq Scan or through a unique constraint's index.
    parent = Task._meta.db_table
    for (name,) in sql(
        "SELECT indexname FROM pg_indexes WHERE tablename = %s "
        "AND indexname NOT IN (SELECT conname FROM pg_constraint)",
        [parent],
    ):
        sql(f'DROP INDEX "{name}"')
    sql(f"ANALYZE {parent}")
    assert scans_of(claim), "dropping the indexes went unnoticed"
