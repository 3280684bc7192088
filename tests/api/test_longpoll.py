"""Long-poll: at once when work is there, woken by new work (NOTIFY on PostgreSQL, short polling
elsewhere) and by a delayed task falling due, bounded by its timeout, and its own error paths."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.test import Client, override_settings
from django.utils import timezone

from django_tasks_coord import executions
from django_tasks_coord.api import longpoll
from tests.api.conftest import Api, make_user
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def executor(transactional_db) -> Api:
    return Api(make_user("executor", "execute_tasks")[1], Client())


def long_poll(api: Api, timeout: float, **extra) -> tuple[float, dict]:
    began = time.monotonic()
    response = api.post("long-poll", {"definitions": ["test/basic"], "timeout": timeout, **extra})
    assert response.status_code == 200, response.json_body
    return time.monotonic() - began, response.json_body


def test_it_returns_at_once_when_work_is_ready(executor):
    created = [executions.create("test/basic").pk for _ in range(3)]
    elapsed, body = long_poll(executor, 10, limit=5)
    assert sorted(t["id"] for t in body["tasks"]) == created
    assert all(t["status"] == "requested" and t["exec_id"] for t in body["tasks"])
    assert elapsed < 5


def test_it_returns_nothing_after_its_timeout(executor):
    elapsed, body = long_poll(executor, 0.3)
    assert body == {"tasks": []}
    assert 0.3 <= elapsed < 5


@override_settings(TASKS_COORD={"LONG_POLL_MAX_TIMEOUT": 0.2})
def test_its_timeout_is_capped_by_the_setting(executor):
    elapsed, body = long_poll(executor, 3600)
    assert body == {"tasks": []}
    assert elapsed < 5


def waiting() -> bool:
    """a long-poll waits"""
    return any(hub.waiters for hub in list(longpoll._hubs.values()))


def test_new_work_wakes_it(executor):
    created: list[int] = []

    def create_soon() -> None:
        wait_for(waiting, timeout=10)  # the long-poll waits: now new work must wake it
        created.append(executions.create("test/basic").pk)
        connections.close_all()

    thread = threading.Thread(target=create_soon)
    thread.start()
    elapsed, body = long_poll(executor, 20)
    thread.join()
    assert [t["id"] for t in body["tasks"]] == created
    assert elapsed < 5  # woken, not timed out


def test_a_delayed_task_falling_due_wakes_it(executor):
    due = executions.create("test/basic", execute_at=timezone.now() + timedelta(seconds=0.4))
    elapsed, body = long_poll(executor, 20)
    assert [t["id"] for t in body["tasks"]] == [due.pk]
    assert 0.3 <= elapsed < 5


def test_its_errors(executor, transactional_db):
    anonymous = Api(None, Client())
    assert anonymous.post("long-poll", {"definitions": ["test/basic"]}).status_code == 401
    submitter = Api(make_user("alice", "submit_tasks")[1], Client())
    assert submitter.post("long-poll", {"definitions": ["test/basic"]}).status_code == 403
    response = executor.post("long-poll", {"definitions": ["test/basic"], "timeout": -1})
    assert (response.status_code, response.json_body["error"]["path"]) == (400, "/timeout")
    response = executor.post("long-poll", {"definitions": ["nope"], "timeout": 0})
    assert (response.status_code, response.json_body["error"]["code"]) == (
        404,
        "unknown_definition",
    )
    assert executor.post("long-poll", "{").status_code == 400
    assert executor.call("GET", "long-poll").status_code == 405


@pytest.mark.parametrize("revoke", ["delete the token", "withdraw the permission"])
def test_a_waiting_long_poll_whose_token_is_revoked_claims_nothing(executor, revoke):
    """The token is checked again before each claim, not only when the long-poll began."""
    from django.contrib.auth.models import Permission

    from django_tasks_coord.models import ApiToken, Task

    created: list[int] = []

    def revoke_then_create() -> None:
        wait_for(waiting, timeout=10)
        if revoke == "delete the token":
            ApiToken.objects.all().delete()
        else:
            user = ApiToken.objects.get().user
            user.user_permissions.remove(Permission.objects.get(codename="execute_tasks"))
        created.append(executions.create("test/basic").pk)
        connections.close_all()

    thread = threading.Thread(target=revoke_then_create)
    thread.start()
    response = executor.post("long-poll", {"definitions": ["test/basic"], "timeout": 20})
    thread.join()
    expected = (
        (401, "not_authenticated") if revoke == "delete the token" else (403, "permission_denied")
    )
    assert (response.status_code, response.json_body["error"]["code"]) == expected
    task = Task.objects.get(pk=created[0])
    assert (executions.status(task)[0].value, task.exec_id) == ("ready", None)  # not handed out


def test_a_token_revoked_while_it_claims_gets_nothing(executor):
    """The token is checked again after the claim: a revocation that lands between the
    check and the claim (the task may be younger than the revocation) hands nothing out."""
    from django_tasks_coord.exceptions import TasksCoordError
    from django_tasks_coord.models import Task

    created = executions.create("test/basic")
    checks: list[int] = []

    def authorize() -> None:
        checks.append(1)
        if len(checks) > 1:
            raise TasksCoordError("revoked meanwhile")

    with pytest.raises(TasksCoordError, match="revoked meanwhile"):
        longpoll._check(["test/basic"], 10, authorize)
    assert len(checks) == 2
    task = Task.objects.get(pk=created.pk)
    assert (executions.status(task)[0].value, task.exec_id, task.deadline) == ("ready", None, None)
    (again,) = executions.poll(["test/basic"], 10)  # the next entitled poll gets it
    assert again.pk == created.pk
