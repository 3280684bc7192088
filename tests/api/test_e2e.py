"""End to end: a live ASGI server (uvicorn serving the API with serve_api and persistent
connections, as documented; some tests also the deployment before it, serve_long_polls) and a
runscheduler node on the test database, executors written without Django in other processes
(Python, and the Node.js and curl snippets of docs/executors.md), and 50 long-polls waiting at
once."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
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


#: The ASGI applications of tests.api.asgi, the CONN_MAX_AGE each is served with, and uvicorn's
#: HTTP parser and event loop: the documented deployment (serve_api) on ``uvicorn[standard]``'s
#: httptools and uvloop, the one before it on plain uvicorn's pure-Python h11 and asyncio.
DEPLOYMENTS = {
    "application": ("60", ("--http=httptools", "--loop=uvloop")),
    "long_polls_application": ("0", ("--http=h11", "--loop=asyncio")),
}
BOTH = pytest.mark.parametrize("server", list(DEPLOYMENTS), indirect=True)


@pytest.fixture
def server(request, transactional_db) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """uvicorn serving tests.api.asgi (``application`` unless the test asks for another) on a
    free port; yields its base URL and process."""
    app = getattr(request, "param", "application")
    conn_max_age, flavour = DEPLOYMENTS[app]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = start(
        "uvicorn",
        f"tests.api.asgi:{app}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--lifespan=off",
        "--no-access-log",
        "--log-level=warning",
        *flavour,
        DJANGO_SETTINGS_MODULE="tests.api.server_settings",
        API_SERVER_CONN_MAX_AGE=conn_max_age,
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


def test_an_executor_learns_of_a_cancel_in_the_answer_to_notify(server):
    """The executor (plain HTTP) reports progress with notify; a user cancels the task; the
    next notify answers cancel_requested, and the task ends canceled whatever it reports."""
    base, _ = server
    _, submit = make_user("alice", "submit_tasks")
    _, execute = make_user("runner", "execute_tasks")
    status, created = call(
        base, submit, "POST", "", {"definition": "e2e/sum", "params": {"a": 1, "b": 2}}
    )
    assert status == 201, created
    status, claimed = call(base, execute, "POST", "claim", {"definitions": ["e2e/sum"]})
    (task,) = claimed["tasks"]
    beat = {"exec_id": task["exec_id"], "progress": {"percent": 40}}
    status, body = call(base, execute, "POST", f"{task['id']}/notify", beat)
    assert (status, body["cancel_requested"], body["progress"]) == (200, False, {"percent": 40})
    status, body = call(base, submit, "POST", f"{task['id']}/cancel")
    assert (status, body["status"], body["cancel_requested"]) == (200, "in_progress", True)
    status, body = call(base, execute, "POST", f"{task['id']}/notify", beat)
    assert (status, body["status"], body["cancel_requested"]) == (200, "in_progress", True)
    done = {"exec_id": task["exec_id"], "result": {"sum": 3}}
    status, body = call(base, execute, "POST", f"{task['id']}/success", done)
    assert (status, body["outcome"], body["outcome_reason"]) == (200, "canceled", "canceled")
    status, body = call(base, submit, "GET", str(task["id"]))
    assert (body["outcome"], body["progress"], body["result"]) == (
        "canceled",
        {"percent": 40},
        None,
    )


@BOTH
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
    # serve_api: the waiting requests hold no thread (uvicorn's and the database threads only)
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


# --- hostile input through the live server (the same as test_hostile_input.py, in process) -----


def send(
    base: str,
    token: str,
    method: str,
    path: str,
    body: bytes | list[bytes] | None = None,
    content_type: str | None = "application/json",
) -> tuple[int, dict[str, str], bytes]:
    """One raw request: ``body`` bytes as they are, or a list of chunks sent with
    ``Transfer-Encoding: chunked`` (no Content-Length). Returns status, headers, body."""
    url = urllib.parse.urlsplit(f"{base}/{path}")
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    headers = {"Authorization": f"Bearer {token}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    try:
        if isinstance(body, list):
            headers["Transfer-Encoding"] = "chunked"
            connection.request(method, url.path, iter(body), headers, encode_chunked=True)
        else:
            connection.request(method, url.path, body, headers)
        response = connection.getresponse()
        headers = {name.lower(): value for name, value in response.getheaders()}
        return response.status, headers, response.read()
    finally:
        connection.close()


def json_error(answer: tuple[int, dict[str, str], bytes], status: int, code: str) -> dict:
    got, headers, content = answer
    assert got == status, content[:300]
    assert headers["content-type"] == "application/json", headers
    error = json.loads(content)["error"]
    assert error["code"] == code and error["message"]
    return error


BIG = 2621440 + 1  # one byte over Django's default DATA_UPLOAD_MAX_MEMORY_SIZE


@BOTH
def test_hostile_bodies_get_json_4xx_from_the_live_server(server):
    base, _ = server
    _, submit = make_user("alice", "submit_tasks")
    _, execute = make_user("runner", "execute_tasks")
    surrogate = rb'{"definition": "e2e/sum", "params": {"a": [0, 1, "\ud800"]}}'
    assert json_error(send(base, submit, "POST", "", surrogate), 400, "invalid_request")[
        "path"
    ] == ("/params/a/2")
    nul = rb'{"definition": "e2e/sum", "label": "\u0000"}'
    assert (
        json_error(send(base, submit, "POST", "", nul), 400, "invalid_request")["path"] == "/label"
    )
    deep = b'{"definition": "e2e/sum", "params": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    json_error(send(base, submit, "POST", "", deep), 400, "invalid_json")
    json_error(
        send(base, execute, "POST", "long-poll", b"[" * 3000 + b"]" * 3000), 400, "invalid_json"
    )
    plain = b'{"definitions": ["e2e/sum"], "timeout": 0}'
    for path in ("poll", "long-poll", "claim", "complete"):
        answer = send(base, execute, "POST", path, plain, content_type="text/plain")
        json_error(answer, 415, "unsupported_media_type")
    assert not Task.objects.exists()


@BOTH
@pytest.mark.parametrize("path", ["", "poll", "long-poll", "claim", "complete"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_over_the_size_limit_is_a_json_413_from_the_live_server(server, path, framing):
    base, _ = server
    _, token = make_user("root", "submit_tasks", "execute_tasks")
    body = b'{"definition": "e2e/sum", "params": "' + b"x" * BIG + b'"}'
    if framing == "chunked":
        answer = send(
            base, token, "POST", path, [body[i : i + 65536] for i in range(0, len(body), 65536)]
        )
    else:
        answer = send(base, token, "POST", path, body)
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in json_error(answer, 413, "body_too_large")["message"]
    assert not Task.objects.exists()


@BOTH
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_long_poll_reads_a_valid_body_over_64_kib_whole(server, framing):
    base, _ = server
    _, token = make_user("root", "submit_tasks", "execute_tasks")
    created = call(base, token, "POST", "", {"definition": "e2e/sum", "params": {"a": 1, "b": 2}})
    assert created[0] == 201
    body = b'{"definitions": ["e2e/sum"],' + b" " * 100_000 + b'"timeout": 5}'
    chunks = [body[i : i + 8192] for i in range(0, len(body), 8192)]
    status, _, content = send(
        base, token, "POST", "long-poll", chunks if framing == "chunked" else body
    )
    assert status == 200, content[:300]
    assert [task["id"] for task in json.loads(content)["tasks"]] == [created[1]["id"]]


@BOTH
def test_head_answers_like_get_from_the_live_server(server):
    base, _ = server
    _, token = make_user("alice", "submit_tasks")
    created = call(base, token, "POST", "", {"definition": "e2e/sum", "params": {"a": 1, "b": 2}})
    for path in ("", str(created[1]["id"]), "definitions", "openapi.json"):
        got_status, got_headers, got = send(base, token, "GET", path, content_type=None)
        status, headers, content = send(base, token, "HEAD", path, content_type=None)
        assert (status, got_status) == (200, 200), path
        assert content == b""
        assert headers["content-type"] == got_headers["content-type"] == "application/json"
        assert int(headers["content-length"]) == len(got), path
    status, headers, _ = send(base, token, "HEAD", "long-poll", content_type=None)
    assert (status, headers["allow"]) == (405, "POST")


# --- the executors of docs/executors.md ----------------------------------------------------------

DOCS = ROOT / "docs" / "executors.md"


def snippet(after: str, language: str) -> str:
    """The first ``language`` code block of docs/executors.md after the line ``after``."""
    text = DOCS.read_text()
    rest = text[text.index(after) :]
    begin = rest.index(f"```{language}\n") + len(language) + 4
    return rest[begin : rest.index("```", begin)]


def all_succeeded(ids: list[int]) -> bool:
    """every task succeeded"""
    return Task.objects.filter(pk__in=ids, state=TaskState.SUCCEEDED).count() == len(ids)


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_the_documented_node_executor_runs_tasks_in_batches(server, tmp_path):
    base, _ = server
    _, submit = make_user("alice", "submit_tasks")
    _, execute = make_user("runner", "execute_tasks")
    code = snippet("### In batches", "js").replace('"billing/send-invoice"', '"e2e/sum"')
    script = tmp_path / "executor.mjs"
    script.write_text("const sendInvoice = async ({ a, b }) => ({ sum: a + b });\n" + code)
    ids = []
    for n in range(30):
        status, body = call(
            base, submit, "POST", "", {"definition": "e2e/sum", "params": {"a": n, "b": 1}}
        )
        assert status == 201, body
        ids.append(body["id"])
    node = subprocess.Popen(
        ["node", str(script)],
        env={"PATH": os.environ.get("PATH", ""), "TASKS_URL": base, "TASKS_TOKEN": execute},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: all_succeeded(ids) or node.poll() is not None, timeout=60)
    finally:
        _, err = reap(node, signal.SIGTERM)
    assert all_succeeded(ids), err
    assert {task.result["sum"] - task.payload["a"] for task in Task.objects.filter(pk__in=ids)} == {
        1
    }
    assert not err


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl, jq")
@pytest.mark.parametrize(
    ("after", "tasks"), [("Or with curl and", 1), ("With curl and jq, one", 3)]
)
def test_the_documented_curl_rounds_run_tasks(server, after, tasks):
    base, _ = server
    _, submit = make_user("alice", "submit_tasks")
    _, execute = make_user("runner", "execute_tasks")
    script = snippet(after, "sh").replace('"billing/send-invoice"', '"test/basic"')
    ids = [
        call(base, submit, "POST", "", {"definition": "test/basic"})[1]["id"] for _ in range(tasks)
    ]
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env={"PATH": os.environ.get("PATH", ""), "BASE": base, "TOKEN": execute},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert all_succeeded(ids)
    assert {task.result["ok"] for task in Task.objects.filter(pk__in=ids)} == {True}
