"""The admin answers an operator's first questions (issue 18, point 4).

Is work piling up (the dashboard's backlog)? What failed and why (the task list's message,
the attempt log)? Will this job run again? Can this job be edited? When, in which zone?
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse
from django.utils import timezone

from django_tasks_coord import scheduling
from django_tasks_coord.admin import dashboard
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import JobKind, PeriodicTask, Task
from django_tasks_coord.scheduling import JOBS_TOPIC
from tests.factories import TaskFactory, TopicFactory

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:django_tasks_coord_dashboard_changelist")
TASKS = reverse("admin:django_tasks_coord_task_changelist")
TOPICS = reverse("admin:django_tasks_coord_topic_changelist")
JOBS = reverse("admin:django_tasks_coord_periodictask_changelist")
NOOP = "tests.testapp.job_functions.noop"


def job_url(job_id: str, view: str = "change") -> str:
    return reverse(f"admin:django_tasks_coord_periodictask_{view}", args=[job_id])


def task_url(task: Task) -> str:
    return reverse("admin:django_tasks_coord_task_change", args=[task.pk])


def aged(task: Task, minutes: float) -> Task:
    Task.objects.filter(pk=task.pk).update(created_at=timezone.now() - timedelta(minutes=minutes))
    return task


@pytest.fixture
def work():
    """mail: 3 pending (the oldest 90 minutes old), 1 active, 1 requested, 2 finished;
    idle: nothing; the jobs topic: 1 pending run."""
    mail, idle, jobs = (
        TopicFactory(name="mail"),
        TopicFactory(name="idle"),
        TopicFactory(name=JOBS_TOPIC),
    )
    aged(TaskFactory(topic=mail), 90)
    aged(TaskFactory(topic=mail), 10)
    TaskFactory(topic=mail)
    TaskFactory(topic=mail, state=TaskState.ACTIVE, exec_id="00000000-0000-0000-0000-000000000001")
    TaskFactory(topic=mail, state=TaskState.REQUESTED)
    TaskFactory.create_batch(2, topic=mail, state=TaskState.SUCCEEDED, finished_at=timezone.now())
    aged(TaskFactory(topic=jobs), 2)
    return mail, idle, jobs


def test_backlog_per_topic_pending_active_and_oldest_age(work):
    rows = {row.topic: row for row in dashboard.backlog(timezone.now())}
    mail = rows["mail"]
    assert (mail.pending, mail.active) == (3, 2)
    assert timedelta(minutes=89) < mail.oldest_pending < timedelta(minutes=92)
    assert mail.oldest_pending_text.startswith("1h 3")
    assert (rows["idle"].pending, rows["idle"].active, rows["idle"].oldest_pending) == (0, 0, None)
    assert rows[JOBS_TOPIC].internal and not mail.internal


def test_backlog_takes_the_same_few_queries_for_any_number_of_topics(work):
    with CaptureQueriesContext(connection) as few:
        dashboard.backlog(timezone.now())
    for n in range(20):
        TaskFactory(topic=TopicFactory(name=f"more-{n}"))
    with CaptureQueriesContext(connection) as many:
        assert len(dashboard.backlog(timezone.now())) == 23
    assert len(few) == len(many) == 3
    grouped = many.captured_queries[1]["sql"]
    assert "GROUP BY" in grouped.upper()


def test_dashboard_shows_the_backlog_with_internal_topics_apart(viewer_client, work):
    response = viewer_client.get(DASHBOARD)
    html = response.content.decode()
    assert [row.topic for row in response.context["backlog"]] == ["idle", "mail"]
    assert [row.topic for row in response.context["internal_backlog"]] == [JOBS_TOPIC]
    user_table = html[html.index('id="tc-backlog"') : html.index('id="tc-backlog-internal"')]
    assert 'data-topic="mail"' in user_table and JOBS_TOPIC not in user_table
    assert "Internal topics" in html
    assert html.index("Backlog per topic") < html.index("Throughput, last hour")


def test_the_task_list_shows_the_message_not_the_label(admin_client):
    TaskFactory(state=TaskState.FAILED, message="SMTP 550: mailbox unavailable " * 5)
    html = admin_client.get(TASKS).content.decode()
    assert "field-message_short" in html and "field-state" in html
    assert 'title="SMTP 550: mailbox unavailable' in html  # the whole message on hover
    # Cut to 60 characters.
    assert ">SMTP 550: mailbox unavailable SMTP 550: mailbox unavailable…</span>" in html
    assert "column-label" not in html


def test_paused_reads_as_text(admin_client):
    TopicFactory(name="stopped", paused=True)
    TopicFactory(name="going")
    html = admin_client.get(TOPICS).content.decode()
    assert '<td class="field-status">Paused</td>' in html
    assert '<td class="field-status">Running</td>' in html
    assert "field-paused" not in html
    scheduling.schedule_recurring(NOOP, 60, job_id="held")
    scheduling.pause("held")
    html = admin_client.get(JOBS).content.decode()
    assert '<td class="field-status">Paused</td>' in html and "field-paused" not in html
    detail = admin_client.get(job_url("held")).content.decode()
    assert "field-status" in detail and "field-paused" not in detail  # no check mark


def test_a_paused_job_whose_callable_does_not_import_says_so(admin_client):
    scheduling.schedule_recurring(NOOP, 60, job_id="ghost")
    PeriodicTask.objects.filter(pk="ghost").update(
        task="tests.testapp.job_functions.gone", paused=True
    )
    html = admin_client.get(job_url("ghost")).content.decode()
    assert "Paused: its callable does not import" in html


def finished_job(job_id: str) -> PeriodicTask:
    """A recurring job that submitted its max_count runs: the scheduler disabled it."""
    scheduling.schedule_recurring(NOOP, 60, job_id=job_id, max_count=2)
    PeriodicTask.objects.filter(pk=job_id).update(
        run_count=2, enabled=False, finished_at=timezone.now()
    )
    return PeriodicTask.objects.get(pk=job_id)


def test_a_finished_job_says_it_will_not_run_again(admin_client):
    finished_job("twice")
    html = admin_client.get(job_url("twice")).content.decode()
    assert "This job has finished (" in html and "it will not run again." in html
    assert "Finished: it will not run again" in html  # its status
    assert 'class="tc-elapses"' not in html  # no future elapses
    assert 'data-action="pause"' not in html and 'data-action="resume"' not in html
    assert 'data-action="run_now"' in html  # an extra run is still possible


def test_a_one_time_job_that_ran_is_finished(admin_client):
    scheduling.schedule_one_time(NOOP, timezone.now() + timedelta(hours=1), job_id="once")
    PeriodicTask.objects.filter(pk="once").update(
        run_count=1, enabled=False, finished_at=timezone.now(), nextrun=None
    )
    html = admin_client.get(job_url("once")).content.decode()
    assert "it will not run again." in html and 'data-action="pause"' not in html


def test_a_declared_job_has_no_save_and_no_delete(admin_client):
    scheduling.schedule_periodic(NOOP, "hourly", job_id="in-code", declared=True)
    response = admin_client.get(job_url("in-code"))
    html = response.content.decode()
    assert response.status_code == 200
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert "deletelink" not in html
    assert admin_client.post(job_url("in-code", "delete"), {"post": "yes"}).status_code == 403
    # The changelist's bulk delete refuses a selection that holds it (Django's per-object
    # delete permission), and deletes jobs scheduled at run time.
    scheduling.schedule_periodic(NOOP, "hourly", job_id="at-run-time")
    bulk = {"action": "delete_selected", "post": "yes"}
    response = admin_client.post(JOBS, {**bulk, "_selected_action": ["in-code", "at-run-time"]})
    assert response.status_code == 403
    assert PeriodicTask.objects.filter(pk__in=["in-code", "at-run-time"]).count() == 2
    admin_client.post(JOBS, {**bulk, "_selected_action": ["at-run-time"]})
    assert list(PeriodicTask.objects.values_list("pk", flat=True)) == ["in-code"]


def test_a_job_scheduled_at_run_time_still_has_save_and_delete(admin_client):
    scheduling.schedule_periodic(NOOP, "hourly", job_id="editable")
    html = admin_client.get(job_url("editable")).content.decode()
    assert 'name="_save"' in html and "deletelink" in html


@override_settings(TIME_ZONE="Europe/Berlin")
def test_times_show_their_zone(admin_client):
    task = TaskFactory(state=TaskState.FAILED, finished_at=timezone.now())
    html = admin_client.get(TASKS).content.decode()
    local = timezone.localtime(task.finished_at)
    assert f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}" in html
    assert local.tzname() in ("CET", "CEST")
    detail = admin_client.get(task_url(task)).content.decode()
    created = timezone.localtime(Task.objects.get(pk=task.pk).created_at)
    assert f"{created:%Y-%m-%d %H:%M:%S} {created.tzname()}" in detail
    dashboard = admin_client.get(DASHBOARD).content.decode()
    assert f" {local.tzname()}; this page reloads" in dashboard


def test_verbose_names_match_the_docs(admin_client):
    html = admin_client.get(reverse("admin:index")).content.decode()
    for name in ("Nodes", "Leaders", "Group members"):
        assert f">{name}</a>" in html
    for old in ("Owners", "Token holders", "Health checks"):
        assert f">{old}</a>" not in html


def test_recreated_links_the_new_task(admin_client):
    failed = TaskFactory(state=TaskState.FAILED, finished_at=timezone.now())
    response = admin_client.post(
        TASKS, {"action": "recreate", "_selected_action": [failed.pk]}, follow=True
    )
    copy = Task.objects.get(original_id=failed.pk)
    html = response.content.decode()
    assert f'New: <a href="{task_url(copy)}">#{copy.pk}</a>' in html


def test_run_now_links_the_new_run(admin_client):
    scheduling.schedule_periodic(NOOP, "hourly", job_id="now")
    response = admin_client.post(
        reverse("admin:django_tasks_coord_periodictask_object_action", args=["now", "run_now"]),
        follow=True,
    )
    run = Task.objects.get(identifier="now")
    assert f'New: <a href="{task_url(run)}">#{run.pk}</a>' in response.content.decode()


def test_the_attempt_log_is_a_table_with_node_time_and_error(admin_client):
    task = TaskFactory(
        state=TaskState.FAILED,
        finished_at=timezone.now(),
        attempt_log=[
            {
                "attempt": 1,
                "worker_id": "host:1:abc",
                "started_at": "2026-05-01T12:00:00+00:00",
                "finished_at": "2026-05-01T12:00:01+00:00",
                "outcome": "failed",
                "exception_class_path": "builtins.RuntimeError",
                "error": "smtp down",
            }
        ],
    )
    html = admin_client.get(task_url(task)).content.decode()
    assert (
        "<td>1</td><td>host:1:abc</td><td>2026-05-01 12:00:00 UTC</td>"
        "<td>2026-05-01 12:00:01 UTC</td><td>failed</td><td>RuntimeError: smtp down</td>"
    ) in html


def test_stored_job_kinds_other_than_periodic_stay_read_only(admin_client):
    scheduling.schedule_recurring(NOOP, 60, job_id="every-minute")
    assert PeriodicTask.objects.get(pk="every-minute").kind == JobKind.RECURRING
    html = admin_client.get(job_url("every-minute")).content.decode()
    assert 'name="_save"' not in html


@pytest.mark.skipif(connection.vendor != "postgresql", reason="reads PostgreSQL plans")
def test_the_backlog_reads_unfinished_tasks_through_indexes_not_history(work):
    """With sequential scans ruled out, the grouped query is served by indexes that only
    reach unfinished tasks: partial ones, or ones leading with ``state`` (a range seek)."""
    TaskFactory.create_batch(
        50, topic=work[0], state=TaskState.SUCCEEDED, finished_at=timezone.now()
    )
    with CaptureQueriesContext(connection) as queries:
        dashboard.backlog(timezone.now())
    grouped = queries.captured_queries[1]["sql"]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {grouped}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute(
            "SELECT i.relname, x.indpred IS NOT NULL, a.attname FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]"
        )
        indexes = {name: (partial, leading) for name, partial, leading in cursor.fetchall()}
    assert "Seq Scan" not in plan, plan
    used = re.findall(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan) (?:using|on) (\w+)", plan)
    assert used, plan
    for name in used:
        partial, leading = indexes[name]
        assert partial or leading == "state", (name, plan)
