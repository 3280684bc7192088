"""Concurrency limits, global and per params path, under 8 executor threads calling the API."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connections
from django.test import Client

from django_tasks_coord import executions
from django_tasks_coord.enums import IN_FLIGHT, TaskState
from django_tasks_coord.models import Task
from tests.api.conftest import Api, make_user

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8


def in_flight(definition: str) -> Counter[str]:
    rows = Task.objects.filter(topic_id=definition, state__in=IN_FLIGHT)
    return Counter(rows.values_list("concurrency_key", flat=True))


def run_executors(definition: str, token: str, check) -> tuple[list[int], list[str]]:
    """8 threads poll/start/notify/success through the API until nothing is left; ``check``
    inspects the database after every hand-out and start. Returns the ids each thread ran."""
    done: list[int] = []
    problems: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def executor() -> None:
        api = Api(token, Client())
        start.wait()
        idle = 0
        try:
            while idle < 20:
                tasks = api.ok("POST", "poll", {"definitions": [definition], "limit": 2})["tasks"]
                problems.extend(check())
                if not tasks:
                    idle += 1
                    if (
                        not Task.objects.filter(topic_id=definition)
                        .exclude(state=TaskState.SUCCEEDED)
                        .exists()
                    ):
                        return
                    continue
                idle = 0
                for task in tasks:
                    body = {"exec_id": task["exec_id"]}
                    api.ok("POST", f"{task['id']}/start", body)
                    problems.extend(check())
                    api.ok("POST", f"{task['id']}/notify", body)
                    api.ok("POST", f"{task['id']}/success", {**body, "result": task["id"]})
                    with lock:
                        done.append(task["id"])
        except Exception as exc:  # noqa: BLE001 - reported by the test
            problems.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=executor) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    return done, problems


def test_a_global_limit_holds_under_8_executor_threads():
    _, token = make_user("executor", "execute_tasks")
    for _ in range(40):
        executions.create("test/limited")
    peak = Counter()

    def check() -> list[str]:
        now = sum(in_flight("test/limited").values())
        peak["max"] = max(peak["max"], now)
        return [f"{now} tasks in flight, limit 3"] if now > 3 else []

    done, problems = run_executors("test/limited", token, check)
    assert problems == []
    assert sorted(done) == sorted(Task.objects.values_list("pk", flat=True))  # each exactly once
    assert Task.objects.filter(state=TaskState.SUCCEEDED).count() == 40
    assert set(Task.objects.values_list("attempts", flat=True)) == {1}
    assert peak["max"] >= 2  # the threads really overlapped


def test_a_limit_per_params_value_holds_under_8_executor_threads():
    _, token = make_user("executor", "execute_tasks")
    for i in range(45):
        executions.create("test/per-key", {"resourceType": ["disk", "cpu", "net"][i % 3], "n": i})
    for _ in range(5):
        executions.create("test/per-key", {"n": "no resource type"})  # the key "": one more bucket
    peak = Counter()

    def check() -> list[str]:
        counts = in_flight("test/per-key")
        peak["total"] = max(peak["total"], sum(counts.values()))
        return [f"{key!r}: {n} in flight, limit 2" for key, n in counts.items() if n > 2]

    done, problems = run_executors("test/per-key", token, check)
    assert problems == []
    assert len(done) == len(set(done)) == 50
    assert set(Task.objects.values_list("concurrency_key", flat=True)) == {"disk", "cpu", "net", ""}
    assert peak["total"] > 2  # different values ran side by side
