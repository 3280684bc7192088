"""The dashboard: linked from the admin index, throughput chart, failures, leaders, nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_tasks_coord import coordination
from django_tasks_coord.admin.dashboard import CHART_HEIGHT, WINDOW, throughput
from django_tasks_coord.enums import TaskState
from tests.factories import OwnerFactory, TaskFactory, TopicFactory

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:django_tasks_coord_dashboard_changelist")


def test_throughput_buckets_per_minute_with_an_injected_now():
    now = datetime(2026, 5, 1, 12, 30, 20, tzinfo=UTC)
    mail = TopicFactory(name="mail")
    for minutes_ago, state in [(0, 40), (0, 43), (1, 40), (1, 40), (59, 40), (61, 40)]:
        TaskFactory(
            topic=mail, state=state, finished_at=now - timedelta(minutes=minutes_ago, seconds=5)
        )
    TaskFactory(topic=mail)  # not finished
    (chart,) = throughput(now)
    assert (chart.topic, chart.finished, chart.failed, chart.peak) == ("mail", 5, 1, 2)
    assert len(chart.bars) == WINDOW
    last, before = chart.bars[-1], chart.bars[-2]
    assert (last.finished, last.failed, last.height, last.failed_height) == (
        2,
        1,
        CHART_HEIGHT,
        CHART_HEIGHT / 2,
    )
    assert before.finished == 2
    assert chart.bars[0].finished == 1  # 59 minutes ago; 61 is outside the hour
    assert last.label.endswith("2 finished, 1 failed")


def test_index_links_to_the_dashboard(viewer_client):
    html = viewer_client.get(reverse("admin:index")).content.decode()
    assert f'href="{DASHBOARD}"' in html


def test_dashboard_shows_chart_failures_leaders_and_live_nodes(viewer_client):
    now = timezone.now()
    mail = TopicFactory(name="mail")
    TaskFactory.create_batch(3, topic=mail, state=TaskState.SUCCEEDED, finished_at=now)
    failed = TaskFactory(
        topic=mail, state=TaskState.FAILED, finished_at=now, identifier="x", message="boom"
    )
    TaskFactory(topic=mail, state=TaskState.FAILED, finished_at=now - timedelta(hours=2))
    OwnerFactory(name="node-1")
    coordination.join("billing", "node-1")
    coordination.try_acquire("billing", "node-1", timedelta(seconds=30))

    response = viewer_client.get(DASHBOARD)
    assert response.status_code == 200
    html = response.content.decode()
    assert '<meta http-equiv="refresh" content="15">' in html
    assert '<svg class="tc-chart"' in html and 'data-topic="mail"' in html
    assert html.count('class="tc-failed"') == 1
    assert response.context["failures_count"] == 1
    assert f'href="{reverse("admin:django_tasks_coord_task_change", args=[failed.pk])}"' in html
    assert "state__exact=43&amp;finished_at__gte=" in html
    assert [h.group_id for h in response.context["leaders"]] == ["billing"]
    assert [n.name for n in response.context["nodes"]] == ["node-1"]


def test_the_failures_link_lists_the_last_hours_failures(viewer_client):
    now = timezone.now()
    recent = TaskFactory(state=TaskState.FAILED, finished_at=now)
    TaskFactory(state=TaskState.FAILED, finished_at=now - timedelta(hours=2))
    url = viewer_client.get(DASHBOARD).context["failures_url"]
    assert [t.pk for t in viewer_client.get(url).context["cl"].result_list] == [recent.pk]


def test_empty_dashboard(viewer_client):
    html = viewer_client.get(DASHBOARD).content.decode()
    assert "No task finished in the last hour." in html and "No live node." in html


def test_staff_without_view_permissions_get_no_dashboard(db):
    client = Client()
    client.force_login(User.objects.create_user("nobody", password="pw", is_staff=True))
    assert client.get(DASHBOARD).status_code == 403
    assert DASHBOARD not in client.get(reverse("admin:index")).content.decode()
