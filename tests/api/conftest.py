"""Fixtures of the HTTP API tests: users with tokens, an API client, a movable clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from django_tasks_coord import definitions, executions
from django_tasks_coord.api.auth import issue_token
from tests.api import defs  # noqa: F401  (declares the test definitions)


class Clock:
    """The time of :mod:`django_tasks_coord.executions`, moved by hand."""

    def __init__(self) -> None:
        self.now = timezone.now().replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(executions, "clock", clock)
    return clock


@pytest.fixture(autouse=True)
def _restore_definitions() -> Iterator[None]:
    """Tests may declare definitions of their own; forget them afterwards."""
    before = {d.name for d in definitions.all()}
    yield
    for definition in definitions.all():
        if definition.name not in before:
            definitions.forget(definition.name)


def make_user(name: str, *codenames: str) -> tuple[User, str]:
    user = User.objects.create_user(name)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    _, token = issue_token(user, f"{name}'s token")
    return user, token


@dataclass
class Api:
    """A test client speaking JSON with a bearer token."""

    token: str | None
    client: Client

    def call(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        url = f"/tasks/{path}"
        if method == "GET":
            response = self.client.get(url, query, headers=headers)
        else:
            data = body if isinstance(body, str | bytes) else json.dumps(body)
            response = self.client.generic(
                method, url, data, content_type="application/json", headers=headers
            )
        response.json_body = json.loads(response.content) if response.content else None
        return response

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, body)

    def get(self, path: str, **query: Any) -> Any:
        return self.call("GET", path, **query)

    def ok(self, method: str, path: str, body: Any = None, expect: int = 200, **query: Any) -> Any:
        response = self.call(method, path, body, **query)
        assert response.status_code == expect, response.json_body
        return response.json_body


@pytest.fixture
def executor(db: None) -> Api:
    """A client whose user may run tasks (not create them)."""
    return Api(make_user("executor", "execute_tasks")[1], Client())


@pytest.fixture
def submitter(db: None) -> Api:
    """A client whose user may create and cancel tasks (not run them)."""
    return Api(make_user("alice", "submit_tasks")[1], Client())


@pytest.fixture
def nobody(db: None) -> Api:
    """A client whose user has no permission of this app."""
    return Api(make_user("nobody")[1], Client())


@pytest.fixture
def anonymous() -> Api:
    return Api(None, Client())


def run_one(executor: Api, definition: str = "test/basic") -> dict[str, Any]:
    """Poll one task of ``definition`` and start it; return the started task."""
    (task,) = executor.ok("POST", "poll", {"definitions": [definition]})["tasks"]
    return executor.ok("POST", f"{task['id']}/start", {"exec_id": task["exec_id"]})
