"""Competing executor processes: every task handed out exactly once, and limits that hold
across processes (PostgreSQL, MariaDB: row locks; SQLite: serialized writes)."""

from __future__ import annotations

from collections import Counter

import pytest

from django_tasks_coord import executions
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from tests.processes import run_together

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

PROCESSES = 4


def compete(definition: str, batch: int) -> list[dict]:
    return run_together("tests.workers.executor", definition, str(batch), count=PROCESSES)


@pytest.mark.parametrize("batch", [1, 10])
def test_competing_executors_get_every_task_exactly_once(vendor, batch):
    total = 600 if vendor != "sqlite" else 200
    for i in range(total):
        executions.create("test/basic", {"i": i})
    results = compete("test/basic", batch)
    ran = Counter(pk for result in results for pk in result["done"])
    assert sum(ran.values()) == total
    assert set(ran.values()) == {1}
    assert Task.objects.filter(state=TaskState.SUCCEEDED).count() == total
    assert set(Task.objects.values_list("attempts", flat=True)) == {1}
    assert sum(1 for result in results if result["done"]) >= 2  # the work was shared


@pytest.mark.parametrize(("definition", "limit"), [("test/limited", 3), ("test/per-key", 2)])
def test_concurrency_limits_hold_across_processes(definition, limit):
    for i in range(90):
        executions.create(definition, {"resourceType": ["a", "b", "c"][i % 3]})
    results = compete(definition, 5)
    assert Task.objects.filter(state=TaskState.SUCCEEDED).count() == 90
    assert max(result["peak"] for result in results) <= limit
