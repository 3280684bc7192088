"""Nodes (owners) and coordination groups in the admin."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.urls import reverse

from django_tasks_coord import coordination
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import HealthCheck, Owner
from tests.factories import OwnerFactory, TaskFactory

pytestmark = pytest.mark.django_db

OWNERS = reverse("admin:django_tasks_coord_owner_changelist")
HOLDERS = reverse("admin:django_tasks_coord_tokenholder_changelist")
MEMBERS = reverse("admin:django_tasks_coord_healthcheck_changelist")


@pytest.fixture
def nodes() -> tuple[Owner, Owner]:
    live, dead = OwnerFactory(name="live"), OwnerFactory(name="dead")
    Owner.objects.filter(pk=dead.pk).update(heartbeat=Now() - timedelta(minutes=5))
    for _ in range(2):
        TaskFactory(state=TaskState.ACTIVE, owner=live, exec_id=uuid.uuid4())
    TaskFactory(state=TaskState.SUCCEEDED, owner=live)  # not held any more
    TaskFactory(state=TaskState.ACTIVE, owner=dead, exec_id=uuid.uuid4())
    return live, dead


def test_owners_alive_or_dead_with_heartbeat_age_and_tasks_held(viewer_client, nodes):
    response = viewer_client.get(OWNERS)
    assert response.status_code == 200
    rows = {o.name: o for o in response.context["cl"].result_list}
    assert (rows["live"].alive, rows["live"].held) == (True, 2)
    assert (rows["dead"].alive, rows["dead"].held) == (False, 1)
    assert rows["live"].age < timedelta(seconds=30)
    assert timedelta(minutes=4) < rows["dead"].age < timedelta(minutes=10)
    html = response.content.decode()
    assert "tc-badge tc-ok" in html and "tc-badge tc-bad" in html
    assert f"owner__id__exact={nodes[0].pk}" in html  # tasks held link to the task list


@pytest.mark.parametrize(("value", "expected"), [("1", ["live"]), ("0", ["dead"])])
def test_owner_liveness_filter(viewer_client, nodes, value, expected):
    cl = viewer_client.get(OWNERS, {"alive": value}).context["cl"]
    assert [o.name for o in cl.result_list] == expected


def test_owner_detail(viewer_client, nodes):
    url = reverse("admin:django_tasks_coord_owner_change", args=[nodes[1].pk])
    html = viewer_client.get(url).content.decode()
    assert "dead" in html and "testhost" in html


def test_groups_with_holder_term_and_heartbeat_age(viewer_client):
    coordination.join("billing", "node-1")
    coordination.join("billing", "node-2")
    assert coordination.try_acquire("billing", "node-1", timedelta(seconds=30)) == 1
    coordination.join("reports", "node-3")
    coordination.try_acquire("reports", "node-3", timedelta(seconds=30))
    HealthCheck.objects.filter(task_id="node-3").update(last_heartbeat=Now() - timedelta(hours=2))
    response = viewer_client.get(HOLDERS)
    assert response.status_code == 200
    rows = {h.group_id: h for h in response.context["cl"].result_list}
    assert (rows["billing"].task_id, rows["billing"].term, rows["billing"].alive) == (
        "node-1",
        1,
        True,
    )
    assert rows["reports"].alive is False or rows["reports"].alive == 0
    assert rows["reports"].age > timedelta(hours=1)
    html = response.content.decode()
    assert "2h 0m" in html or "1h 59m" in html

    members = viewer_client.get(MEMBERS, {"group_id": "billing"}).context["cl"].result_list
    assert sorted(m.task_id for m in members) == ["node-1", "node-2"]
    dead = viewer_client.get(MEMBERS, {"alive": "0"}).context["cl"].result_list
    assert [m.task_id for m in dead] == ["node-3"]


def test_nothing_here_can_be_changed(admin_client, nodes):
    assert admin_client.get(reverse("admin:django_tasks_coord_owner_add")).status_code == 403
    delete = reverse("admin:django_tasks_coord_owner_delete", args=[nodes[0].pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Owner.objects.count() == 2
