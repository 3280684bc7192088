"""End to end: a live ASGI server (uvicorn, long-polls served by serve_long_polls) and a runscheduler node on the test database, an
executor written without Django in another process, and 50 long-polls waiting at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from tests.api.conftest import make_user
from tests.processes import ROOT, reap, runscheduler, start, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

EXECUTOR = Path(__file__).with_name("executor_client.py")


def call(base: str, token: str, method: str, path: str, body: object = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{base}/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def server(transactional_db) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """uvicorn serving tests.api.asgi on a free port; yields its base URL and process."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = start(
        "uvicorn",
        "tests.api.asgi:application",
        "--host=127.0.0.1",
        f"--port={port}",
        "--lifespan=off",
        "--no-access-log",
        "--log-level=warning",
        DJANGO_SETTINGS_MODULE="tests.api.server_settings",
    )
    base = f"http://127.0.0.1:{port}/tasks"

    def answers() -> bool:
        """the server answers"""
        try:
            with urllib.request.urlopen(f"{base}/openapi.json", timeout=2):
                return True
        except OSError:
            assert proc.poll() is None, proc.stderr.read()
            return False

    try:
        wait_for(answers, timeout=30)
        yield base, proc
    finally:
        reap(proc, signal.SIGTERM)


def test_an_executor_without_django_runs_tasks_through_a_live_server(server):
    base, _ = server
    _, submit = make_user("alice", "submit_tasks")
    _, execute = make_user("runner", "execute_tasks")
    node = runscheduler(
        "--node-id=reaper",
        settings={"REAP_INTERVAL": 0.2, "HEARTBEAT_FREQUENCY": 0.1, "SCHEDULER": False},
    )
    executor = subprocess.Popen(
        [sys.executable, str(EXECUTOR), base, execute, "e2e/sum", "6"],
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "")},  # no Django, no settings: just HTTP
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        created = {}
        for name, params in [
            ("plain1", {"a": 1, "b": 2}),
            ("plain2", {"a": 10, "b": -3}),
            ("plain3", {"a": 0, "b": 0}),
            ("plain4", {"a": 5, "b": 5}),
            ("fails_once", {"a": 2, "b": 2, "fail_first": True}),
            ("abandoned_once", {"a": 3, "b": 4, "abandon_first": True}),
        ]:
            status, body = call(
                base, submit, "POST", "", {"definition": "e2e/sum", "params": params, "label": name}
            )
            assert status == 201, body
            created[name] = body
        out, err = executor.communicate(timeout=120)
        assert executor.returncode == 0, err
        summary = json.loads(out)
    finally:
        reap(executor, signal.SIGKILL)
        reap(node, signal.SIGTERM)
    assert sorted(summary["succeeded"]) == sorted(task["id"] for task in created.values())
    assert summary["failed_once"] == [created["fails_once"]["id"]]
    assert summary["abandoned"] == [created["abandoned_once"]["id"]]
    for name, task in created.items():
        status, body = call(base, submit, "GET", str(task["id"]))
        assert (body["status"], body["outcome"]) == ("done", "succeeded"), name
        assert body["result"] == {"sum": task["params"]["a"] + task["params"]["b"]}
    assert call(base, submit, "GET", str(created["fails_once"]["id"]))[1]["retry_count"] == 1
    abandoned = Task.objects.get(pk=created["abandoned_once"]["id"])
    assert abandoned.attempts == 1  # handed out twice, started once: the reaper freed it


def test_the_long_poll_route_answers_like_the_rest_of_the_api(server):
    base, _ = server
    _, execute = make_user("runner", "execute_tasks")
    assert call(base, execute, "GET", "long-poll")[0] == 405
    assert call(base, "nope", "POST", "long-poll", {"definitions": ["e2e/sum"]})[0] == 401
    status, body = call(base, execute, "POST", "long-poll", {"definitions": []})
    assert (status, body["error"]["path"]) == (400, "/definitions")
    status, body = call(
        base, execute, "POST", "long-poll", {"definitions": ["e2e/sum"], "timeout": 0}
    )
    assert (status, body) == (200, {"tasks": []})


def test_50_long_polls_wait_at_once_without_a_connection_each(server):
    base, proc = server
    _, execute = make_user("runner", "execute_tasks")
    _, submit = make_user("alice", "submit_tasks")
    waiters = 50
    results: list[tuple[float, dict]] = []
    lock = threading.Lock()

    def long_poll(timeout: float) -> None:
        began = time.monotonic()
        status, body = call(
            base, execute, "POST", "long-poll", {"definitions": ["e2e/sum"], "timeout": timeout}
        )
        assert status == 200, body
        with lock:
            results.append((time.monotonic() - began, body))

    def sample() -> dict[str, int]:
        threads = int(Path(f"/proc/{proc.pid}/status").read_text().split("Threads:")[1].split()[0])
        found = {"server_threads": threads}
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )
                found["other_connections"] = cursor.fetchone()[0]
        return found

    # 1. Nothing to do: 50 long-polls of 2 s all end after about 2 s, so they waited side by side.
    threads = [threading.Thread(target=long_poll, args=(2.0,)) for _ in range(waiters)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    wait_for(lambda: time.monotonic() - began > 1.2, timeout=5)  # mid-wait: look at the server
    during = sample()
    for thread in threads:
        thread.join(30)
    elapsed = time.monotonic() - began
    assert len(results) == waiters
    assert all(body["tasks"] == [] for _, body in results)
    assert elapsed < 10, elapsed  # not 2 s per batch of a thread pool: see the thread count
    # serve_long_polls: the waiting requests hold no thread (uvicorn's and the check pool's only)
    assert during["server_threads"] < 20, during
    if "other_connections" in during:
        assert during["other_connections"] <= 10, during  # the LISTEN one and a few checks
    print(f"\n50 idle long-polls: {elapsed:.2f}s in all, during the wait {during}")

    # 2. 50 waiters, then 50 tasks: each waiter wakes with exactly one task.
    results.clear()
    threads = [threading.Thread(target=long_poll, args=(30.0,)) for _ in range(waiters)]
    for thread in threads:
        thread.start()
    created = time.monotonic()
    for i in range(waiters):
        assert (
            call(base, submit, "POST", "", {"definition": "e2e/sum", "params": {"a": i, "b": 0}})[0]
            == 201
        )
    for thread in threads:
        thread.join(60)
    handed = [task["id"] for _, body in results for task in body["tasks"]]
    assert len(handed) == len(set(handed)) == waiters
    assert time.monotonic() - created < 15
    assert Task.objects.filter(state=TaskState.REQUESTED).count() == waiters
