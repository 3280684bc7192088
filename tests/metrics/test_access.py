"""Who may read the metrics view, and the view without ``prometheus_client``."""

from __future__ import annotations

import importlib
import sys

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings

from django_tasks_coord import queue
from django_tasks_coord.api.auth import issue_token
from django_tasks_coord.exceptions import ConfigurationError, TasksCoordError

pytestmark = pytest.mark.django_db

URL = "/tasks/metrics"


@pytest.fixture
def secret_topic() -> None:
    queue.register_topic("m-secret")
    queue.push("m-secret", "id", {"password": "hunter2-payload"})


def user(name: str, *, allowed: bool) -> User:
    made = User.objects.create_user(name, password="pw")
    if allowed:
        made.user_permissions.add(Permission.objects.get(codename="view_metrics"))
    return User.objects.get(pk=made.pk)  # fresh: no permission cache


def test_anonymous_requests_are_refused_outside_debug(client: Client, secret_topic: None) -> None:
    response = client.get(URL)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"tasks_coord_" not in response.content
    with override_settings(TASKS_COORD={"METRICS_PUBLIC": False}, DEBUG=True):
        assert client.get(URL).status_code == 401  # False: even under DEBUG


def test_open_under_debug_or_when_public(client: Client, secret_topic: None) -> None:
    with override_settings(DEBUG=True):
        assert client.get(URL).status_code == 200
    with override_settings(TASKS_COORD={"METRICS_PUBLIC": True}):
        response = client.get(URL)
    assert response.status_code == 200
    assert b'tasks_coord_tasks{state="pending",topic="m-secret"} 1.0' in response.content
    assert b"hunter2" not in response.content  # never a payload


def test_a_user_needs_the_view_metrics_permission(client: Client, secret_topic: None) -> None:
    client.force_login(user("plain", allowed=False))
    assert client.get(URL).status_code == 403
    client.force_login(user("scraper", allowed=True))
    assert client.get(URL).status_code == 200
    client.force_login(User.objects.create_superuser("root", password="pw"))
    assert client.get(URL).status_code == 200


def test_an_api_token_of_a_user_with_the_permission(client: Client, secret_topic: None) -> None:
    _, good = issue_token(user("prometheus", allowed=True), "prometheus")
    _, other = issue_token(user("executor", allowed=False), "executor")
    response = client.get(URL, headers={"Authorization": f"Bearer {good}"})
    assert response.status_code == 200
    assert b"tasks_coord_nodes" in response.content
    assert client.get(URL, headers={"Authorization": f"Bearer {other}"}).status_code == 403
    assert client.get(URL, headers={"Authorization": "Bearer dtc_nonsense"}).status_code == 401


def test_only_get(client: Client) -> None:
    with override_settings(TASKS_COORD={"METRICS_PUBLIC": True}):
        assert client.post(URL).status_code == 405


def test_openmetrics_when_asked(client: Client, secret_topic: None) -> None:
    with override_settings(TASKS_COORD={"METRICS_PUBLIC": True}):
        response = client.get(URL, headers={"Accept": "application/openmetrics-text"})
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.rstrip().endswith(b"# EOF")


def test_without_prometheus_client_mounting_the_view_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(sys.modules):
        if name.startswith("django_tasks_coord.metrics.") or name == "django_tasks_coord.urls":
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    for module in ("django_tasks_coord.urls", "django_tasks_coord.metrics.node"):
        with pytest.raises(ConfigurationError, match=r"django-tasks-coord\[metrics\]") as caught:
            importlib.import_module(module)
        assert isinstance(caught.value, TasksCoordError)


def test_bad_metrics_settings_are_e003() -> None:
    from django_tasks_coord import checks

    with override_settings(
        TASKS_COORD={"METRICS_PUBLIC": "yes", "METRICS_PORT": 70000, "METRICS_ADDRESS": None}
    ):
        messages = checks.check_settings()
    assert {message.id for message in messages} == {"tasks_coord.E003"}
    assert [message.msg for message in messages] == [
        "TASKS_COORD: METRICS_PUBLIC must be None, True or False, not 'yes'.",
        "TASKS_COORD: METRICS_PORT must be None or a port number (0 to 65535), not 70000.",
        "TASKS_COORD: METRICS_ADDRESS must be a str, not None.",
    ]
