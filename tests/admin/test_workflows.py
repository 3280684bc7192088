"""Workflows in the admin: the list (state, step counts, filter, search), the page with the
graph drawn as SVG (steps colored by state, edges, links to the tasks), cancel, hostile ids."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_tasks_coord import queue, workflows
from django_tasks_coord.admin.graph import BOX_WIDTH, COLUMN_GAP, MARGIN, Node, layout, levels
from django_tasks_coord.enums import Result, TaskState
from django_tasks_coord.models import Task, Workflow, WorkflowState

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_tasks_coord_workflow_changelist")


def change_url(pk: object) -> str:
    return reverse("admin:django_tasks_coord_workflow_change", args=[pk])


def action_url(pk: object, name: str) -> str:
    return reverse("admin:django_tasks_coord_workflow_object_action", args=[pk, name])


def diamond(name: str = "diamond") -> int:
    """root → (left, right) → join, push steps on topic ``wf``."""
    queue.register_topic("wf")
    root = workflows.push("wf", f"{name}-root", {}, name="root")
    left = workflows.push("wf", f"{name}-left", {}, name="left", after=root)
    right = workflows.push("wf", f"{name}-right", {}, name="right", after=root)
    join = workflows.push("wf", f"{name}-join", {}, name="join", after=[left, right])
    return workflows.start(name, [root, left, right, join])


def run_root() -> None:
    """The root's task succeeds and the workflow advances: left and right are enqueued."""
    (task,) = queue.poll("wf")
    queue.complete(task, Result.SUCCESS)
    workflows.advance()


def test_levels_and_layout_put_each_step_right_of_its_deepest_parent():
    nodes = [
        Node("a", [], "succeeded"),
        Node("b", ["a"], "enqueued"),
        Node("c", ["a", "b"], "waiting"),
        Node("d", [], "waiting"),
    ]
    assert levels(nodes) == {"a": 0, "b": 1, "c": 2, "d": 0}
    picture = layout(nodes)
    x = {box.name: box.x for box in picture.boxes}
    assert x == {
        "a": MARGIN,
        "b": MARGIN + BOX_WIDTH + COLUMN_GAP,
        "c": MARGIN + 2 * (BOX_WIDTH + COLUMN_GAP),
        "d": MARGIN,
    }
    assert [box.row for box in picture.boxes] == [0, 0, 0, 1]
    assert {(e.parent, e.child) for e in picture.edges} == {("a", "b"), ("a", "c"), ("b", "c")}
    assert picture.width == x["c"] + BOX_WIDTH + MARGIN
    long = layout([Node("x" * 50, [], "waiting")]).boxes[0]
    assert len(long.label) == 20 and long.tooltip == "x" * 50


def test_list_shows_state_and_step_counts_and_filters_by_state(admin_client):
    running = diamond("one")
    run_root()
    done = diamond("two")
    Workflow.objects.filter(pk=done).update(state=WorkflowState.SUCCEEDED)
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    rows = {w.pk: w for w in response.context["cl"].result_list}
    assert list(rows) == [done, running]  # newest first
    assert (rows[running].steps_final, rows[running].steps_total) == (1, 4)
    assert "1 / 4" in response.content.decode()
    filtered = admin_client.get(CHANGELIST, {"state__exact": "succeeded"})
    assert [w.pk for w in filtered.context["cl"].result_list] == [done]


@pytest.mark.parametrize(
    ("term", "expected"),
    [("one", ["one"]), ("ne", ["one"]), ("", ["two", "one"]), ("99999999999999999999", [])],
)
def test_search_by_name_or_id(admin_client, term, expected):
    one, two = diamond("one"), diamond("two")
    response = admin_client.get(CHANGELIST, {"q": term})
    assert response.status_code == 200
    assert [w.name for w in response.context["cl"].result_list] == expected
    by_id = admin_client.get(CHANGELIST, {"q": str(two)})
    assert [w.pk for w in by_id.context["cl"].result_list] == [two]
    assert one != two


def test_page_draws_the_graph_colored_by_state_with_links_to_the_tasks(admin_client):
    workflow_id = diamond()
    run_root()
    response = admin_client.get(change_url(workflow_id))
    assert response.status_code == 200
    html = response.content.decode()
    assert '<svg class="tc-graph"' in html and 'data-steps="4"' in html
    states = dict(re.findall(r'data-step="(\w+)" data-state="(\w+)"', html))
    assert states == {
        "root": "succeeded",
        "left": "enqueued",
        "right": "enqueued",
        "join": "waiting",
    }
    edges = set(re.findall(r'data-parent="(\w+)" data-child="(\w+)"', html))
    assert edges == {("root", "left"), ("root", "right"), ("left", "join"), ("right", "join")}
    for step in ("root", "left", "right"):
        task = Task.objects.get(identifier=f"diamond-{step}")
        assert f'href="{reverse("admin:django_tasks_coord_task_change", args=[task.pk])}"' in html
    assert (
        len(re.findall(r'href="/admin/django_tasks_coord/task/\d+/change/"', html)) == 3 + 3
    )  # graph and table
    assert "tc-step-canceled" in html  # the legend names every state


def test_a_purged_task_is_named_not_linked(admin_client):
    workflow_id = diamond()
    run_root()
    Task.objects.filter(identifier="diamond-root").delete()
    html = admin_client.get(change_url(workflow_id)).content.decode()
    assert "(purged)" in html
    assert len(re.findall(r'href="/admin/django_tasks_coord/task/\d+/change/"', html)) == 2 + 2


def test_step_names_are_escaped_in_the_picture(admin_client):
    queue.register_topic("wf")
    workflow_id = workflows.start(
        "<b>x</b>", [workflows.push("wf", "x", {}, name="<script>alert(1)</script>")]
    )
    html = admin_client.get(change_url(workflow_id)).content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_cancel_from_the_page_calls_the_service(admin_client):
    workflow_id = diamond()
    run_root()
    page = admin_client.get(change_url(workflow_id)).content.decode()
    assert 'data-action="cancel"' in page
    response = admin_client.post(action_url(workflow_id, "cancel"))
    assert response.status_code == 302
    status = workflows.get(workflow_id)
    assert status.state == WorkflowState.CANCELED
    assert status.steps["join"].state == workflows.StepState.CANCELED
    assert Task.objects.get(identifier="diamond-left").state == TaskState.CANCELED
    # Ended: no button, and the action refuses it (reported, nothing changes).
    assert 'data-action="cancel"' not in admin_client.get(change_url(workflow_id)).content.decode()
    response = admin_client.post(
        CHANGELIST, {"action": "cancel", "_selected_action": [workflow_id]}, follow=True
    )
    assert "It had ended already" in response.content.decode()


def test_cancel_needs_the_cancel_task_permission_and_post(db):
    workflow_id = diamond()
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_workflow"))
    client = Client()
    client.force_login(viewer)
    assert client.get(change_url(workflow_id)).status_code == 200
    assert client.post(action_url(workflow_id, "cancel")).status_code == 403
    viewer.user_permissions.add(Permission.objects.get(codename="cancel_task"))
    client.force_login(User.objects.get(pk=viewer.pk))
    assert client.get(action_url(workflow_id, "cancel")).status_code == 405
    assert client.post(action_url(workflow_id, "cancel")).status_code == 302
    assert workflows.get(workflow_id).state == WorkflowState.CANCELED


def test_workflows_cannot_be_added_edited_or_deleted_here(admin_client):
    workflow_id = diamond()
    assert admin_client.get(reverse("admin:django_tasks_coord_workflow_add")).status_code == 403
    delete = reverse("admin:django_tasks_coord_workflow_delete", args=[workflow_id])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    html = admin_client.get(change_url(workflow_id)).content.decode()
    assert 'name="_save"' not in html
    assert Workflow.objects.filter(pk=workflow_id).exists()


@pytest.mark.parametrize(
    "bad", ["0", "abc", "-1", "1.5", "99999999999999999999", "%3Cscript%3E", "1'--"]
)
def test_hostile_ids_answer_404(admin_client, bad):
    diamond()
    assert admin_client.get(change_url(bad)).status_code == 404
    assert admin_client.post(action_url(bad, "cancel")).status_code == 404
    history = reverse("admin:django_tasks_coord_workflow_history", args=[bad])
    assert admin_client.get(history).status_code in (302, 404)
