"""serve_api: the API's calls served beside Django's request handling, in process (the same
through a live uvicorn server: test_e2e.py). Each call runs in one of the API's database
threads, whose connections last as CONN_MAX_AGE says; the rest goes to the wrapped app."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.db.backends.signals import connection_created
from django.test import override_settings

from django_tasks_coord import executions
from django_tasks_coord.api import threads
from django_tasks_coord.api.asgi import serve_api
from tests.api.conftest import make_user

pytestmark = pytest.mark.django_db(transaction=True)


class Wrapped:
    """The ASGI application serve_api wraps: records the paths it was given, answers 299."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def request(
    app: Any,
    method: str,
    path: str,
    body: bytes = b"",
    token: str = "",
    *,
    disconnect: bool = False,
) -> tuple[int, dict[str, str], bytes]:
    """One request to ``app``; with ``disconnect``, the client leaves once the body is sent."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"host", b"127.0.0.1"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "scheme": "http",
        "http_version": "1.1",
    }
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            if disconnect:
                return {"type": "http.disconnect"}
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asyncio.wait_for(app(scope, receive, send), 30)

    asyncio.run(run())
    if not sent:
        return 0, {}, b""
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


@pytest.fixture
def token(transactional_db) -> str:
    return make_user("executor", "execute_tasks")[1]


@pytest.fixture
def persistent() -> Iterator[None]:
    """Persistent connections for the API's 2 database threads (started anew)."""
    config = connections.settings["default"]
    before = config["CONN_MAX_AGE"]
    threads.close()
    config["CONN_MAX_AGE"] = 60
    try:
        with override_settings(TASKS_COORD={"API_THREADS": 2}):
            yield
    finally:
        threads.close()
        config["CONN_MAX_AGE"] = before


def test_the_api_calls_are_served_and_the_rest_goes_to_the_wrapped_app(token):
    wrapped = Wrapped()
    app = serve_api(wrapped, prefix="tasks")
    for _ in range(2):
        executions.create("test/basic")
    status, headers, body = request(
        app, "POST", "/tasks/poll", b'{"definitions": ["test/basic"]}', token
    )
    assert (status, headers["content-type"]) == (200, "application/json")
    (task,) = json.loads(body)["tasks"]
    assert int(headers["content-length"]) == len(body)
    exec_id = json.dumps({"exec_id": task["exec_id"]}).encode()
    assert request(app, "POST", f"/tasks/{task['id']}/start", exec_id, token)[0] == 200
    assert request(app, "GET", f"/tasks/{task['id']}", b"", token)[0] == 200
    status, _, body = request(
        app, "POST", "/tasks/claim", b'{"definitions": ["test/basic"]}', token
    )
    assert json.loads(body)["tasks"][0]["status"] == "in_progress"
    status, _, body = request(app, "POST", "/tasks/1/start", b"{", token)
    assert (status, json.loads(body)["error"]["code"]) == (400, "invalid_json")  # served here
    # Not the API's operations: Django's (the metrics view of django_tasks_coord.urls, or the
    # API's JSON 404 for an unknown path, through Django's URLs).
    others = [
        "/tasks/openapi.json",
        "/tasks/metrics",
        "/tasks/nowhere/else",
        "/admin/",
        "/tasksx/poll",
    ]
    for path in others:
        assert request(app, "GET", path)[0] == 299
    assert wrapped.paths == others


def test_its_calls_keep_their_connections_when_they_are_persistent(token, persistent):
    for _ in range(12):
        executions.create("test/basic")
    app = serve_api(Wrapped())
    opened: list[object] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(connection)

    connection_created.connect(count)
    try:
        for path in ("poll", "claim", "long-poll") * 4:
            body = b'{"definitions": ["test/basic"], "timeout": 0}'
            if path == "poll":
                body = b'{"definitions": ["test/basic"]}'
            assert request(app, "POST", f"/tasks/{path}", body, token)[0] == 200
    finally:
        connection_created.disconnect(count)
    assert len(opened) <= 2  # one per database thread at most


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_a_body_over_the_limit_is_a_json_413_and_reaches_no_view(token):
    executions.create("test/basic")
    status, _, body = request(serve_api(Wrapped()), "POST", "/tasks/claim", b" " * 101, token)
    assert (status, json.loads(body)["error"]["code"]) == (413, "body_too_large")
    assert executions.status(executions.tasks("test/basic").get())[0] == "ready"


def test_a_failing_call_is_a_logged_json_500(token, monkeypatch, caplog):
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database is on fire")

    monkeypatch.setattr(executions, "poll", broken)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        status, headers, body = request(
            serve_api(Wrapped()), "POST", "/tasks/poll", b'{"definitions": ["test/basic"]}', token
        )
    assert (status, headers["content-type"]) == (500, "application/json")
    assert json.loads(body)["error"]["code"] == "server_error"
    assert "the database is on fire" in caplog.text


def test_a_waiting_claim_ends_when_its_client_leaves(token):
    body = b'{"definitions": ["test/basic"], "timeout": 20}'
    status, _, _ = request(
        serve_api(Wrapped()), "POST", "/tasks/claim", body, token, disconnect=True
    )
    assert status == 0  # nothing sent, and not after 20 s (the request waits at most 30)
    executions.create("test/basic")
    assert executions.status(executions.tasks("test/basic").get())[0] == "ready"
