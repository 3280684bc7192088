"""Tasks in the admin: changelist, filters, search, detail, revive and cancel, counts."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_tasks_coord import queue
from django_tasks_coord.admin import base
from django_tasks_coord.admin.base import EstimatedCountPaginator, table_estimate
from django_tasks_coord.enums import Decision, TaskState
from django_tasks_coord.models import Task
from tests.factories import OwnerFactory, TaskFactory, TopicFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_tasks_coord_task_changelist")


def change_url(task: Task) -> str:
    return reverse("admin:django_tasks_coord_task_change", args=[task.pk])


def action_url(task: Task, name: str) -> str:
    return reverse("admin:django_tasks_coord_task_object_action", args=[task.pk, name])


def listed(client, **params) -> list[int]:
    response = client.get(CHANGELIST, params)
    assert response.status_code == 200, response.content[:500]
    return [task.pk for task in response.context["cl"].result_list]


def failed_task(topic: str = "mail", identifier: str = "order-1") -> Task:
    queue.register_topic(topic)
    queue.push(topic, identifier, {"n": 1})
    (task,) = queue.poll(topic)
    try:
        raise RuntimeError("smtp down")
    except RuntimeError as exc:
        return queue.complete(task, Decision.failure(exc, "could not send"))


@pytest.fixture
def tasks() -> dict[str, Task]:
    mail, sms = TopicFactory(name="mail"), TopicFactory(name="sms")
    owner = OwnerFactory(name="node-a")
    now = timezone.now()
    made = {
        "pending": TaskFactory(topic=mail, identifier="a", label="weekly"),
        "active": TaskFactory(
            topic=mail, identifier="b", state=TaskState.ACTIVE, owner=owner, exec_id=uuid.uuid4()
        ),
        "failed": TaskFactory(topic=sms, identifier="a", state=TaskState.FAILED, finished_at=now),
        "old": TaskFactory(
            topic=sms,
            identifier="c",
            state=TaskState.SUCCEEDED,
            finished_at=now - timedelta(days=40),
        ),
    }
    Task.objects.filter(pk=made["old"].pk).update(created_at=now - timedelta(days=41))
    made["copy"] = queue.recreate(made["failed"])
    return made


def test_changelist_lists_newest_first(admin_client, tasks):
    assert listed(admin_client) == sorted((t.pk for t in tasks.values()), reverse=True)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"topic__name__exact": "mail"}, ["active", "pending"]),
        ({"state__exact": TaskState.FAILED.value}, ["failed"]),
        ({"identifier": "a"}, ["copy", "failed", "pending"]),
        ({"owner__id__exact": "OWNER"}, ["active"]),
        ({"recreated": "1"}, ["copy"]),
        ({"recreated": "0"}, ["old", "failed", "active", "pending"]),
        ({"created_at__gte": "DAYS_AGO_2"}, ["copy", "failed", "active", "pending"]),
        ({"created_at__lt": "DAYS_AGO_2"}, ["old"]),
        ({"finished_at__gte": "DAYS_AGO_2"}, ["failed"]),
        ({"finished_at__isnull": "True"}, ["copy", "active", "pending"]),
    ],
)
def test_filters(admin_client, tasks, params, expected):
    days_ago_2 = str(timezone.now() - timedelta(days=2))
    owner = str(tasks["active"].owner_id)
    params = {k: {"OWNER": owner, "DAYS_AGO_2": days_ago_2}.get(v, v) for k, v in params.items()}
    assert listed(admin_client, **params) == [tasks[name].pk for name in expected]


def test_date_filter_presets(admin_client, tasks):
    response = admin_client.get(CHANGELIST)
    html = response.content.decode()
    assert "Past 7 days" in html and "Has date" in html


def test_identifier_filter_keeps_other_filters_as_hidden_inputs(admin_client, tasks):
    html = admin_client.get(CHANGELIST, {"topic__name__exact": "sms", "q": "a"}).content.decode()
    assert '<input type="hidden" name="topic__name__exact" value="sms">' in html
    assert '<input type="hidden" name="q" value="a">' in html


@pytest.mark.parametrize(
    ("term", "expected"),
    [("a", ["copy", "failed", "pending"]), ("weekly", ["pending"]), ("wee", []), ("SEQ", ["old"])],
)
def test_search_by_identifier_label_or_sequence_exactly(admin_client, tasks, term, expected):
    term = str(tasks["old"].pk) if term == "SEQ" else term
    assert listed(admin_client, q=term) == [tasks[name].pk for name in expected]


def test_detail_shows_payload_error_attempts_and_timestamps(admin_client):
    task = failed_task()
    Task.objects.filter(pk=task.pk).update(
        result={"sent": 0}, attempt_log=[{"attempt": 1, "outcome": "failed"}]
    )
    html = admin_client.get(change_url(task)).content.decode()
    assert "&quot;n&quot;: 1" in html  # the payload, as JSON
    assert "&quot;sent&quot;: 0" in html  # the result
    assert "RuntimeError: smtp down" in html and "Traceback" in html
    assert "could not send" in html
    assert 'class="tc-attempts"' in html and "<td>failed</td>" in html  # the attempt log
    for label in ("Attempts", "Created at", "Started at", "Finished at", "Execute at"):
        assert label in html
    assert 'data-action="reset"' in html and 'data-action="recreate"' in html
    assert 'data-action="cancel"' not in html  # a completed task cannot be canceled


def test_detail_of_a_recreated_task_links_its_original_and_back(admin_client):
    original = failed_task()
    copy = queue.recreate(original)
    html = admin_client.get(change_url(copy)).content.decode()
    assert f'href="{change_url(original)}"' in html
    assert f'href="{change_url(copy)}"' in admin_client.get(change_url(original)).content.decode()
    Task.objects.filter(pk=original.pk).delete()  # purged
    assert f"#{original.pk} (purged)" in admin_client.get(change_url(copy)).content.decode()


def test_reset_action(admin_client):
    task = failed_task()
    response = admin_client.post(
        CHANGELIST, {"action": "reset", "_selected_action": [task.pk]}, follow=True
    )
    assert "Reset: 1 task." in response.content.decode()
    task.refresh_from_db()
    assert (task.state, task.attempts, task.error) == (TaskState.PENDING, 0, None)
    assert LogEntry.objects.get().change_message == "Reset in the admin."


def test_recreate_from_the_detail_page(admin_client):
    task = failed_task()
    response = admin_client.post(action_url(task, "recreate"))
    assert response.status_code == 302 and response["Location"] == change_url(task)
    copy = Task.objects.get(original=task)
    assert (copy.recreated, copy.state) == (True, TaskState.PENDING)
    task.refresh_from_db()
    assert task.state == TaskState.FAILED  # the original keeps its result
    assert LogEntry.objects.get().change_message == f"Recreated in the admin as #{copy.pk}."


def test_cancel_action(admin_client, tasks):
    admin_client.post(
        CHANGELIST,
        {"action": "cancel", "_selected_action": [tasks["pending"].pk, tasks["old"].pk]},
    )
    tasks["pending"].refresh_from_db()
    tasks["old"].refresh_from_db()
    assert tasks["pending"].state == TaskState.CANCELED
    assert tasks["old"].state == TaskState.SUCCEEDED  # refused by the service, reported
    assert LogEntry.objects.count() == 1


def test_cancel_of_a_running_task_asks_it_to_stop_and_its_page_shows_progress(admin_client, tasks):
    active = tasks["active"]
    Task.objects.filter(pk=active.pk).update(progress={"rows": 1200})
    admin_client.post(action_url(active, "cancel"))
    active.refresh_from_db()
    assert active.state == TaskState.ACTIVE  # still running: asked to stop
    assert active.cancel_requested_at is not None
    assert active.owner.cancel_requests == 1  # its node reads it with its next heartbeat
    html = admin_client.get(change_url(active)).content.decode()
    assert "cancel requested at" in html.lower()
    assert "1200" in html and "progress" in html.lower()


def test_a_refused_action_is_reported_per_task(admin_client, tasks):
    response = admin_client.post(action_url(tasks["pending"], "reset"), follow=True)
    html = response.content.decode()
    assert (
        f"Cannot reset task #{tasks['pending'].pk}: it is pending; only completed tasks can be."
        in html
    )
    tasks["pending"].refresh_from_db()
    assert tasks["pending"].state == TaskState.PENDING
    assert not LogEntry.objects.exists()


def test_actions_refuse_get_and_need_csrf(admin_client, csrf_client):
    task = failed_task()
    assert admin_client.get(action_url(task, "reset")).status_code == 405
    assert csrf_client.post(action_url(task, "reset")).status_code == 403
    task.refresh_from_db()
    assert task.state == TaskState.FAILED


def test_viewer_sees_tasks_but_cannot_revive_or_cancel(viewer_client):
    task = failed_task()
    assert viewer_client.get(CHANGELIST).context["action_form"] is None
    html = viewer_client.get(change_url(task)).content.decode()
    assert "RuntimeError: smtp down" in html and "data-action=" not in html
    for name in ("reset", "recreate"):
        assert viewer_client.post(action_url(task, name)).status_code == 403
    viewer_client.post(CHANGELIST, {"action": "reset", "_selected_action": [task.pk]})
    task.refresh_from_db()
    assert task.state == TaskState.FAILED


def test_revive_and_cancel_are_separate_permissions(db):
    from django.test import Client

    from tests.admin.conftest import VIEW_ONLY, _staff

    client = Client()
    client.force_login(_staff("canceller", [*VIEW_ONLY, "cancel_task"]))
    task = failed_task()
    assert client.post(action_url(task, "reset")).status_code == 403
    queue.push("mail", "order-2")
    pending = Task.objects.get(identifier="order-2")
    assert client.post(action_url(pending, "cancel")).status_code == 302
    pending.refresh_from_db()
    assert pending.state == TaskState.CANCELED


def test_tasks_cannot_be_added_edited_or_deleted_here(admin_client, tasks):
    assert admin_client.get(reverse("admin:django_tasks_coord_task_add")).status_code == 403
    task = tasks["pending"]
    assert admin_client.post(change_url(task), {"state": 40}).status_code == 403
    delete = reverse("admin:django_tasks_coord_task_delete", args=[task.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403


# --- counting -------------------------------------------------------------------------


def count_queries(queries) -> list[str]:
    return [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]


def test_unfiltered_list_uses_the_planners_estimate_where_there_is_one(
    admin_client, tasks, vendor, monkeypatch
):
    monkeypatch.setattr(EstimatedCountPaginator, "exact_below", 0)
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(CHANGELIST)
    paginator = response.context["cl"].paginator
    counts = count_queries(ctx.captured_queries)
    if vendor == "sqlite":
        assert not paginator.estimated and response.context["cl"].result_count == 5
        assert len(counts) == 1
    else:
        assert paginator.estimated
        assert counts == []  # no COUNT(*) at all
        assert "the database" in response.content.decode()  # "(the database's estimate)"


def test_small_estimates_are_replaced_by_an_exact_count(admin_client, tasks):
    response = admin_client.get(CHANGELIST)
    assert response.context["cl"].result_count == 5
    assert not response.context["cl"].paginator.estimated


def test_filtered_counts_stop_at_the_cap(admin_client, tasks, monkeypatch):
    monkeypatch.setattr(EstimatedCountPaginator, "cap", 2)
    monkeypatch.setattr(
        type(admin_client.get(CHANGELIST).context["cl"].model_admin), "list_per_page", 1
    )
    response = admin_client.get(CHANGELIST, {"recreated": "0"})
    cl = response.context["cl"]
    assert (cl.result_count, cl.paginator.capped) == (2, True)
    assert "more than 2" in " ".join(response.content.decode().split())
    assert cl.full_result_count is None  # show_full_result_count = False: no second count
    response = admin_client.get(CHANGELIST, {"recreated": "1"})
    assert (response.context["cl"].result_count, response.context["cl"].paginator.capped) == (
        1,
        False,
    )


def test_table_estimate(tasks, vendor):
    estimate = table_estimate(Task, "default")
    if vendor == "sqlite":
        assert estimate is None
    else:
        assert isinstance(estimate, int) and estimate >= 0


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL: ANALYZE in a transaction"
)
def test_postgres_estimate_follows_the_statistics(tasks):
    TaskFactory.create_batch(200, topic=tasks["pending"].topic)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_tasks_coord_task")
    assert 150 <= table_estimate(Task, "default") <= 260


def count_plan(queryset) -> str:
    """PostgreSQL's plan for counting ``queryset`` with sequential scans ruled out."""
    sql, sql_params = queryset.order_by().query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN SELECT COUNT(*) FROM ({sql}) AS filtered", sql_params)
        return "\n".join(row[0] for row in cursor.fetchall())


def leading_columns_of_used_indexes(plan: str) -> set[str]:
    """The first column of every index of the task table (or its partitions) that ``plan`` scans."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.relname, a.attname FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0] "
            "WHERE x.indrelid = 'django_tasks_coord_task'::regclass OR x.indrelid IN ("
            "SELECT inhrelid FROM pg_inherits "
            "WHERE inhparent = 'django_tasks_coord_task'::regclass)"
        )
        leading = dict(cursor.fetchall())
    used = re.findall(
        r"(?:Index Scan|Index Only Scan|Bitmap Index Scan)(?: Backward)? (?:using|on) (\w+)", plan
    )
    return {leading[name] for name in used if name in leading}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="reads PostgreSQL plans")
@pytest.mark.parametrize(
    ("params", "columns"),
    [
        ({"topic__name__exact": "mail"}, {"topic_id"}),
        ({"state__exact": "43"}, {"state"}),
        ({"identifier": "a"}, {"identifier"}),
        ({"owner__id__exact": "1"}, {"owner_id"}),
        ({"recreated": "1"}, {"original_id"}),
        ({"created_at__gte": "2026-01-01 00:00:00+00:00"}, {"created_at"}),
        ({"finished_at__gte": "2026-01-01 00:00:00+00:00"}, {"finished_at"}),
        ({"q": "weekly"}, {"identifier", "label"}),
        ({"definition": "mail"}, {"topic_id"}),
    ],
)
def test_every_filter_has_an_index_behind_it(rf, superuser, tasks, params, columns):
    """With sequential scans ruled out, each filter is served by indexes that *lead* with the
    filtered column (not by walking a whole index that merely contains it)."""
    from django.contrib import admin

    request = rf.get(CHANGELIST, params)
    request.user = superuser
    cl = admin.site._registry[Task].get_changelist_instance(request)
    plan = count_plan(cl.queryset)
    assert "Seq Scan" not in plan, plan
    assert leading_columns_of_used_indexes(plan) == columns, plan


@pytest.mark.skipif(connection.vendor != "postgresql", reason="reads PostgreSQL plans")
def test_the_index_check_notices_an_unindexed_filter(tasks):
    plan = count_plan(Task.objects.filter(attempts=3))
    assert "Seq Scan" in plan or "attempts" not in leading_columns_of_used_indexes(plan)


def test_action_stops_after_max_objects(admin_client, monkeypatch):
    monkeypatch.setattr(base, "MAX_ACTION_OBJECTS", 1)
    first, second = failed_task(identifier="x"), failed_task(identifier="y")
    response = admin_client.post(
        CHANGELIST, {"action": "reset", "_selected_action": [first.pk, second.pk]}, follow=True
    )
    assert "Stopped after 1 objects" in response.content.decode()
    assert Task.objects.filter(state=TaskState.PENDING).count() == 1


# --- task definitions (issue 7) ---------------------------------------------------------


@pytest.fixture
def definition():
    from django_tasks_coord.models import TaskDefinition

    queue.register_topic("render")
    return TaskDefinition.objects.create(
        name="render",
        requested_to_start_timeout=30,
        in_progress_timeout=300,
        allowed_retry_count=2,
        retry_delay=10,
        params_schema={"type": "object"},
    )


def test_filter_by_definition(admin_client, tasks, definition):
    rendered = TaskFactory(topic_id="render")
    assert listed(admin_client, definition="render") == [rendered.pk]


def test_filter_by_an_unknown_definition_lists_nothing(admin_client, tasks):
    assert listed(admin_client, definition="nope") == []


def test_definitions_are_shown_read_only(viewer_client, admin_client, definition):
    from django.contrib.auth.models import Permission

    changelist = reverse("admin:django_tasks_coord_taskdefinition_changelist")
    detail = reverse("admin:django_tasks_coord_taskdefinition_change", args=["render"])
    html = admin_client.get(detail).content.decode()
    assert "&quot;type&quot;: &quot;object&quot;" in html and "definition=render" in html
    assert 'name="in_progress_timeout"' not in html  # no form field: read-only
    assert admin_client.post(detail, {"in_progress_timeout": 1}).status_code == 403
    add = reverse("admin:django_tasks_coord_taskdefinition_add")
    assert admin_client.get(add).status_code == 403
    viewer = viewer_client  # view_taskdefinition is not among its permissions
    assert viewer.get(changelist).status_code == 403
    assert Permission.objects.filter(codename="view_taskdefinition").exists()
