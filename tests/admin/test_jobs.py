"""Periodic jobs in the admin: next elapses, timer validation, pause/resume/run now/pause all."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from django_tasks_coord import scheduling
from django_tasks_coord.admin.jobs import next_elapses
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import PeriodicTask, Task, Topic
from django_tasks_coord.scheduling import JOBS_TOPIC

pytestmark = pytest.mark.django_db

RECORD = "tests.testapp.job_functions.record"
CHANGELIST = reverse("admin:django_tasks_coord_periodictask_changelist")
PAUSE_ALL = reverse("admin:django_tasks_coord_periodictask_pause_all")
RESUME_ALL = reverse("admin:django_tasks_coord_periodictask_resume_all")


def change_url(job_id: str) -> str:
    return reverse("admin:django_tasks_coord_periodictask_change", args=[job_id])


def action_url(job_id: str, name: str) -> str:
    return reverse("admin:django_tasks_coord_periodictask_object_action", args=[job_id, name])


@pytest.fixture
def job() -> str:
    return scheduling.schedule_periodic(RECORD, "Mon..Fri 09:00", job_id="weekday", tz="UTC")


def edit(client, job_id: str, **changes):
    data = {"timer": "Mon..Fri 09:00", "tz": "UTC", "args": "[]", "kwargs": "{}", "priority": "0"}
    data.update(changes)
    return client.post(change_url(job_id), data)


def test_next_elapses_with_an_injected_now(job):
    row = PeriodicTask.objects.get(pk=job)
    now = datetime(2026, 3, 6, 10, 0, tzinfo=UTC)  # a Friday, after 09:00
    assert next_elapses(row, now) == [
        datetime(2026, 3, day, 9, 0, tzinfo=UTC) for day in (9, 10, 11, 12, 13)
    ]


def test_next_elapses_stop_at_the_end_time(job):
    row = PeriodicTask.objects.get(pk=job)
    row.end_time = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    now = datetime(2026, 3, 6, 10, 0, tzinfo=UTC)
    assert len(next_elapses(row, now)) == 2


def test_changelist_and_filters(admin_client, job):
    scheduling.schedule_recurring(RECORD, 60, job_id="minutely")
    scheduling.pause("minutely")
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    assert [j.pk for j in response.context["cl"].result_list] == ["minutely", "weekday"]
    for params, expected in [
        ({"paused__exact": "1"}, ["minutely"]),
        ({"kind__exact": "periodic"}, ["weekday"]),
        ({"enabled__exact": "1"}, ["minutely", "weekday"]),
        ({"last_outcome__exact": TaskState.FAILED.value}, []),
        ({"leader_only__exact": "0"}, ["minutely", "weekday"]),
        ({"declared__exact": "0"}, ["minutely", "weekday"]),
        ({"q": "minutely"}, ["minutely"]),
    ]:
        cl = admin_client.get(CHANGELIST, params).context["cl"]
        assert [j.pk for j in cl.result_list] == expected, params


def test_detail_shows_the_next_five_elapses(admin_client, job):
    html = admin_client.get(change_url(job)).content.decode()
    assert html.count("09:00:00+00:00 UTC</li>") == 5
    assert 'data-action="pause"' in html and 'data-action="run_now"' in html
    assert 'data-action="resume"' not in html


def test_editing_the_timer_reschedules_the_job(admin_client, job):
    response = edit(admin_client, job, timer="*-*-* 18:30", args='["x"]', priority="3")
    assert response.status_code == 302
    row = PeriodicTask.objects.get(pk=job)
    assert (row.timer, row.args, row.priority) == ("*-*-* 18:30:00", ["x"], 3)
    assert row.nextrun.time().isoformat() == "18:30:00"
    assert LogEntry.objects.get().is_change()


def test_a_bad_timer_is_refused_with_the_parsers_message(admin_client, job):
    response = edit(admin_client, job, timer="Mon..Fro 09:00")
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "Fro" in errors["timer"][0]
    assert PeriodicTask.objects.get(pk=job).timer == "Mon..Fri *-*-* 09:00:00"


def test_a_bad_zone_is_refused(admin_client, job):
    response = edit(admin_client, job, tz="Mars/Olympus")
    assert "Mars/Olympus" in response.context["adminform"].form.errors["tz"][0]


def test_a_timer_that_never_elapses_again_is_refused(admin_client, job):
    response = edit(admin_client, job, timer="2001-01-01T00:00:00+00:00")
    assert "never elapses again" in response.context["adminform"].form.errors["timer"][0]


def test_bad_arguments_are_refused(admin_client, job):
    response = edit(admin_client, job, args='{"a": 1}', kwargs="[1]")
    errors = response.context["adminform"].form.errors
    assert "args" in errors and "kwargs" in errors


def test_recurring_and_declared_jobs_are_read_only(admin_client):
    scheduling.schedule_recurring(RECORD, 60, job_id="minutely")
    response = admin_client.get(change_url("minutely"))
    assert response.status_code == 200
    assert 'name="timer"' not in response.content.decode()


def test_pause_resume_and_run_now_actions(admin_client, job):
    admin_client.post(CHANGELIST, {"action": "pause", "_selected_action": [job]})
    assert PeriodicTask.objects.get(pk=job).paused
    admin_client.post(action_url(job, "resume"))
    assert not PeriodicTask.objects.get(pk=job).paused
    response = admin_client.post(action_url(job, "run_now"), follow=True)
    (run,) = Task.objects.filter(topic_id=JOBS_TOPIC, identifier=job)
    assert (run.slot, run.requester) == (None, "admin:root")
    assert "Run now: 1 periodic job." in response.content.decode()
    messages = list(LogEntry.objects.order_by("pk").values_list("change_message", flat=True))
    assert messages == [
        "Paused in the admin.",
        "Resumed in the admin.",
        f"Run now in the admin as #{run.pk}.",
    ]


def test_pause_all_and_resume_all(admin_client, job):
    response = admin_client.post(PAUSE_ALL, follow=True)
    assert Topic.objects.get(pk=JOBS_TOPIC).paused
    assert "All jobs are paused" in response.content.decode()
    admin_client.post(RESUME_ALL)
    assert not Topic.objects.get(pk=JOBS_TOPIC).paused
    entries = LogEntry.objects.filter(object_id=JOBS_TOPIC).order_by("pk")
    assert [e.change_message for e in entries] == [
        "Paused all jobs in the admin.",
        "Resumed all jobs in the admin.",
    ]


def test_changes_refuse_get_and_need_csrf(admin_client, csrf_client, job):
    assert admin_client.get(PAUSE_ALL).status_code == 405
    assert admin_client.get(action_url(job, "run_now")).status_code == 405
    assert csrf_client.post(PAUSE_ALL).status_code == 403
    assert csrf_client.post(action_url(job, "run_now")).status_code == 403
    assert not Topic.objects.filter(pk=JOBS_TOPIC, paused=True).exists()
    assert not Task.objects.filter(identifier=job).exists()


def test_viewer_sees_jobs_but_not_the_actions(viewer_client, job):
    response = viewer_client.get(CHANGELIST)
    assert response.status_code == 200 and response.context["action_form"] is None
    assert 'data-action="pause_all"' not in response.content.decode()
    html = viewer_client.get(change_url(job)).content.decode()
    assert "09:00:00+00:00 UTC</li>" in html and "data-action=" not in html
    assert 'name="timer"' not in html  # no change permission: read-only
    for name in ("pause", "run_now"):
        assert viewer_client.post(action_url(job, name)).status_code == 403
    assert viewer_client.post(PAUSE_ALL).status_code == 403
    assert not PeriodicTask.objects.get(pk=job).paused
    assert not Task.objects.filter(identifier=job).exists()


def test_run_now_and_pause_are_separate_permissions(db, job):
    from django.test import Client

    from tests.admin.conftest import VIEW_ONLY, _staff

    client = Client()
    client.force_login(_staff("runner", [*VIEW_ONLY, "run_periodictask"]))
    assert client.post(action_url(job, "pause")).status_code == 403
    assert client.post(PAUSE_ALL).status_code == 403
    assert client.post(action_url(job, "run_now")).status_code == 302
    assert Task.objects.filter(identifier=job).count() == 1


def test_deleting_a_job_unschedules_it(admin_client, job):
    delete = reverse("admin:django_tasks_coord_periodictask_delete", args=[job])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert not PeriodicTask.objects.exists()


def test_detail_shows_the_limits_of_the_jobs_runs(admin_client, job):
    assert "limits of its runs" in admin_client.get(change_url(job)).content.decode().lower()
    scheduling.set_limits(job, rate="1/h", concurrency=1)
    html = admin_client.get(change_url(job)).content.decode()
    assert "rate 1/h, concurrency 1" in html and JOBS_TOPIC in html
