"""Topics in the admin: depth by state, oldest pending age, pause and resume."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from django_tasks_coord import definitions, queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task, Topic
from tests.factories import OwnerFactory, TaskFactory, TopicFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_tasks_coord_topic_changelist")


def change_url(topic: Topic) -> str:
    return reverse("admin:django_tasks_coord_topic_change", args=[topic.pk])


def action_url(topic: Topic, name: str) -> str:
    return reverse("admin:django_tasks_coord_topic_object_action", args=[topic.pk, name])


@pytest.fixture
def busy() -> Topic:
    topic = TopicFactory(name="mail")
    old = TaskFactory(topic=topic)
    Task.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(minutes=90))
    TaskFactory.create_batch(2, topic=topic)
    TaskFactory(topic=topic, state=TaskState.ACTIVE, owner=OwnerFactory(), exec_id="0" * 32)
    TaskFactory.create_batch(3, topic=topic, state=TaskState.FAILED)
    TopicFactory(name="idle")
    return topic


def test_changelist_shows_depth_and_oldest_pending_age(admin_client, busy):
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    rows = {topic.name: topic for topic in response.context["cl"].result_list}
    assert (rows["mail"].pending, rows["mail"].in_flight) == (3, 1)
    assert rows["mail"].oldest_pending >= timedelta(minutes=89)
    assert (rows["idle"].pending, rows["idle"].oldest_pending) == (0, None)
    html = response.content.decode()
    assert "1h 30m" in html or "1h 29m" in html
    assert "topic__name__exact=mail" in html  # the pending count links to the tasks


def test_changelist_sorts_by_depth(admin_client, busy):
    response = admin_client.get(CHANGELIST, {"o": "-3"})
    assert [t.name for t in response.context["cl"].result_list] == ["mail", "idle"]


def test_filter_by_paused(admin_client, busy):
    queue.pause_topic("idle")
    response = admin_client.get(CHANGELIST, {"paused__exact": "1"})
    assert [t.name for t in response.context["cl"].result_list] == ["idle"]


def test_detail_counts_every_state(admin_client, busy):
    response = admin_client.get(change_url(busy))
    assert response.status_code == 200
    html = response.content.decode()
    assert (
        '<tr><th><a href="/admin/django_tasks_coord/task/?topic__name__exact=mail&amp;state__exact=43">failed</a></th><td>3</td></tr>'
        in html
    )
    assert 'data-action="pause"' in html
    assert 'data-action="resume"' not in html  # only what fits the topic's state


def test_pause_and_resume_actions_call_the_service_and_log(admin_client, busy):
    response = admin_client.post(
        CHANGELIST, {"action": "pause", "_selected_action": [busy.pk]}, follow=True
    )
    assert response.status_code == 200
    assert Topic.objects.get(pk="mail").paused
    assert "Paused: 1 topic." in response.content.decode()
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.change_message) == ("mail", "Paused in the admin.")

    admin_client.post(action_url(busy, "resume"))
    assert not Topic.objects.get(pk="mail").paused
    assert LogEntry.objects.count() == 2


def test_pausing_a_paused_topic_reports_nothing_done(admin_client, busy):
    queue.pause_topic(busy)
    response = admin_client.post(action_url(busy, "pause"), follow=True)
    assert response.status_code == 200
    assert Topic.objects.get(pk="mail").paused


def test_object_actions_refuse_get(admin_client, busy):
    assert admin_client.get(action_url(busy, "pause")).status_code == 405
    assert not Topic.objects.get(pk="mail").paused


def test_object_actions_need_a_csrf_token(csrf_client, busy):
    assert csrf_client.post(action_url(busy, "pause")).status_code == 403
    assert not Topic.objects.get(pk="mail").paused


def test_unknown_action_is_refused(admin_client, busy):
    assert admin_client.post(action_url(busy, "delete")).status_code == 403


def test_viewer_sees_topics_but_not_the_actions(viewer_client, busy):
    response = viewer_client.get(CHANGELIST)
    assert response.status_code == 200
    assert response.context["action_form"] is None  # no action offered at all
    detail = viewer_client.get(change_url(busy)).content.decode()
    assert "data-action=" not in detail
    assert viewer_client.post(action_url(busy, "pause")).status_code == 403
    viewer_client.post(CHANGELIST, {"action": "pause", "_selected_action": [busy.pk]})
    assert not Topic.objects.get(pk="mail").paused
    assert not LogEntry.objects.exists()


def test_operator_may_pause(operator_client, busy):
    assert operator_client.post(action_url(busy, "pause")).status_code == 302
    assert Topic.objects.get(pk="mail").paused


def test_topics_cannot_be_added_or_deleted_here_and_only_retention_is_edited(admin_client, busy):
    assert admin_client.get(reverse("admin:django_tasks_coord_topic_add")).status_code == 403
    admin_client.post(change_url(busy), {"paused": "on", "consecutive_failures": "9"})
    busy.refresh_from_db()
    assert (busy.paused, busy.consecutive_failures) == (False, 0)  # read-only: pause is an action
    delete = reverse("admin:django_tasks_coord_topic_delete", args=[busy.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403


def test_the_retention_policy_is_edited_in_its_own_fieldset(admin_client, busy):
    response = admin_client.get(change_url(busy))
    html = response.content.decode()
    assert "<h2" in html and "Retention" in html
    for name in (
        "keep_completed_days",
        "keep_completed_rows",
        "keep_failed_days",
        "keep_failed_rows",
    ):
        assert f'name="{name}"' in html
    response = admin_client.post(
        change_url(busy),
        {
            "keep_completed_days": "7",
            "keep_completed_rows": "",
            "keep_failed_days": "30",
            "keep_failed_rows": "1000",
        },
    )
    assert response.status_code == 302, response.content.decode()
    busy.refresh_from_db()
    assert (
        busy.keep_completed_days,
        busy.keep_completed_rows,
        busy.keep_failed_days,
        busy.keep_failed_rows,
    ) == (7, None, 30, 1000)
    assert LogEntry.objects.filter(object_id=busy.pk).exists()


def test_saving_the_policy_keeps_a_pause_made_meanwhile(admin_client, busy):
    """Only the four limits are written: the form's stale copy of the topic does not undo a
    pause (or a failure count) written since the page was loaded."""
    admin_client.get(change_url(busy))
    queue.pause_topic(busy)
    Topic.objects.filter(pk=busy.pk).update(consecutive_failures=4)
    admin_client.post(change_url(busy), {"keep_completed_days": "1"})
    busy.refresh_from_db()
    assert (busy.paused, busy.consecutive_failures, busy.keep_completed_days) == (True, 4, 1)


def test_the_policy_needs_the_change_permission(operator_client, busy):
    html = operator_client.get(change_url(busy)).content.decode()
    assert 'name="keep_completed_days"' not in html  # shown read-only
    response = operator_client.post(change_url(busy), {"keep_completed_days": "1"})
    assert response.status_code == 403
    busy.refresh_from_db()
    assert busy.keep_completed_days is None


def test_negative_limits_are_refused_by_the_form(admin_client, busy):
    response = admin_client.post(change_url(busy), {"keep_failed_rows": "-1"})
    assert response.status_code == 200  # the form again, with the error
    assert response.context["adminform"].form.errors["keep_failed_rows"]


def test_total_limits_and_limits_of_key_values_are_edited_and_shown(admin_client, busy):
    from django_tasks_coord import flow

    data = {
        "concurrency_limit": "2",
        "limit_key": "identifier",
        "total_concurrency_limit": "5",
        "total_rate_limit": "100/m",
        "key_limits": '{"vip": {"concurrency": 4}}',
    }
    response = admin_client.post(change_url(busy), data)
    assert response.status_code == 302, response.content.decode()
    busy.refresh_from_db()
    assert (busy.total_concurrency_limit, busy.total_rate_limit) == (5, "100/m")
    assert busy.key_limits == {"vip": {"concurrency": 4}}
    html = admin_client.get(change_url(busy)).content.decode()
    assert "<td>all keys</td><td>1</td><td>0</td><td>rate 100/m, concurrency 5</td>" in html
    listing = admin_client.get(CHANGELIST).content.decode()
    assert "1 key value with their own" in listing
    bad = admin_client.post(change_url(busy), {**data, "key_limits": '{"vip": {"rate": "x"}}'})
    assert bad.status_code == 200 and "N/unit" in bad.content.decode()
    flow._cache.clear()


def test_the_jobs_topics_limits_can_be_edited(admin_client):
    from django_tasks_coord import topics
    from django_tasks_coord.scheduling import JOBS_TOPIC

    jobs = topics.register_internal_topic(JOBS_TOPIC)
    data = {"limit_key": "identifier", "key_limits": '{"nightly": {"rate": "1/h"}}'}
    response = admin_client.post(change_url(jobs), data)
    assert response.status_code == 302, response.content.decode()
    assert Topic.objects.get(name=JOBS_TOPIC).key_limits == {"nightly": {"rate": "1/h"}}


def test_a_definitions_topic_takes_limits_but_no_limit_key_in_the_form(admin_client):
    definitions.define("admin/defined")
    try:
        topic = TopicFactory(name="admin/defined")
        keyed = {"concurrency_limit": "1", "limit_key": "identifier"}
        response = admin_client.post(change_url(topic), keyed)
        assert response.status_code == 200  # the form again, with the error
        assert "executor definition" in str(response.context["adminform"].form.errors)
        response = admin_client.post(change_url(topic), {"rate_limit": "5/s"})
        assert response.status_code == 302
        topic.refresh_from_db()
        assert (topic.rate_limit, topic.limit_key) == ("5/s", "")
        per_value = {"limit_key": "", "key_limits": '{"vip": {"concurrency": 4}}'}
        response = admin_client.post(change_url(topic), per_value)
        assert response.status_code == 200
        assert "executor definition" in str(response.context["adminform"].form.errors)
        totals = {"total_rate_limit": "100/m", "total_concurrency_limit": "3"}
        response = admin_client.post(change_url(topic), totals)
        assert response.status_code == 302, response.content.decode()
        topic.refresh_from_db()
        assert (topic.total_rate_limit, topic.total_concurrency_limit) == ("100/m", 3)
        assert topic.key_limits is None
    finally:
        definitions.forget("admin/defined")
