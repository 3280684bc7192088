"""The dashboard: the backlog per topic, throughput over the last hour, recent failures,
leaders, live nodes.

It is the changelist of the :class:`~django_tasks_coord.models.Dashboard` proxy, so it
has an entry on the admin index of any project. The charts are SVG drawn on the server
(no JavaScript, no build step); the page reloads itself every :attr:`DashboardAdmin.refresh`
seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Min
from django.db.models.functions import TruncMinute
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_tasks_coord.admin.base import ModelAdmin, age, when
from django_tasks_coord.admin.topics import task_list_url
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Dashboard, Task, Topic
from django_tasks_coord.operations import alive_since, holders_with_health, owners_with_health
from django_tasks_coord.topics import RESERVED_PREFIX

#: Minutes shown in the throughput charts (one bar per minute).
WINDOW = 60
#: Geometry of one chart, in SVG user units.
BAR_WIDTH, CHART_HEIGHT = 6, 48


@dataclass
class Bar:
    """One minute of one topic: tasks finished, of which failed; drawn as two stacked rects."""

    x: int
    finished: int = 0
    failed: int = 0
    height: float = 0.0
    failed_height: float = 0.0
    label: str = ""

    @property
    def y(self) -> float:
        return CHART_HEIGHT - self.height

    @property
    def failed_y(self) -> float:
        return CHART_HEIGHT - self.failed_height


@dataclass
class TopicChart:
    """A topic's bars over the window, and its totals."""

    topic: str
    bars: list[Bar] = field(default_factory=list)
    finished: int = 0
    failed: int = 0
    peak: int = 0
    width: int = WINDOW * BAR_WIDTH
    height: int = CHART_HEIGHT


def throughput(now: datetime, window: int = WINDOW) -> list[TopicChart]:
    """Per topic, the tasks finished in each of the last ``window`` minutes before ``now``.

    One grouped query over ``finished_at`` (its index bounds it to the window). The
    minutes are UTC minutes, so no time zone tables are needed on MySQL.
    """
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(minutes=window)
    rows = (
        Task.objects.filter(finished_at__gte=start, finished_at__lt=end)
        .annotate(minute=TruncMinute("finished_at", tzinfo=UTC))
        .order_by()
        .values_list("topic_id", "minute", "state")
        .annotate(n=Count("pk"))
    )
    charts: dict[str, TopicChart] = {}
    for topic, minute, state, n in rows:
        chart = charts.get(topic)
        if chart is None:
            chart = charts[topic] = TopicChart(topic, [Bar(x=i * BAR_WIDTH) for i in range(window)])
        index = int((minute - start).total_seconds() // 60)
        if not 0 <= index < window:
            continue
        bar = chart.bars[index]
        bar.finished += n
        chart.finished += n
        if state == TaskState.FAILED:
            bar.failed += n
            chart.failed += n
    for chart in charts.values():
        chart.peak = max(bar.finished for bar in chart.bars)
        for i, bar in enumerate(chart.bars):
            minute = timezone.localtime(start + timedelta(minutes=i)).strftime("%H:%M")
            bar.label = f"{minute}: {bar.finished} finished, {bar.failed} failed"
            if chart.peak:
                bar.height = CHART_HEIGHT * bar.finished / chart.peak
                bar.failed_height = CHART_HEIGHT * bar.failed / chart.peak
    return sorted(charts.values(), key=lambda chart: chart.topic)


@dataclass
class Backlog:
    """One topic's unfinished work: pending tasks, active ones, and the oldest pending's age.

    ``active`` counts tasks claimed by a node or handed to an executor (ACTIVE, REQUESTED).
    """

    topic: str
    paused: bool = False
    pending: int = 0
    active: int = 0
    oldest_pending: timedelta | None = None

    @property
    def internal(self) -> bool:
        """One of the package's own topics (the jobs topic, a group's leader topic)."""
        return self.topic.startswith(RESERVED_PREFIX)

    @property
    def oldest_pending_text(self) -> str:
        return age(self.oldest_pending) if self.oldest_pending is not None else "-"

    @property
    def pending_url(self) -> str:
        return task_list_url(topic__name__exact=self.topic, state__exact=TaskState.PENDING.value)

    @property
    def active_url(self) -> str:
        return task_list_url(topic__name__exact=self.topic, state__exact=TaskState.ACTIVE.value)


def backlog(now: datetime) -> list[Backlog]:
    """Every topic's :class:`Backlog`, by name, in three queries whatever the number of topics.

    1. the topics (a small table);
    2. one grouped query over the *unfinished* tasks only (``state < SUCCEEDED``): their
       count per topic and state, and the first pending sequence per topic. It never
       reads finished history, whose share of a large table is nearly all of it; on
       PostgreSQL the partial indexes on unfinished tasks and ``(state, sequence)``
       serve it;
    3. the creation time of those first pending tasks, by primary key.
    """
    found = {
        name: Backlog(name, paused)
        for name, paused in Topic.objects.order_by("name").values_list("name", "paused")
    }
    rows = (
        Task.objects.filter(state__lt=TaskState.SUCCEEDED)
        .order_by()
        .values_list("topic_id", "state")
        .annotate(n=Count("pk"), first=Min("sequence"))
    )
    first_pending: dict[int, str] = {}
    for topic, state, n, first in rows:
        item = found.setdefault(topic, Backlog(topic))
        if state == TaskState.PENDING:
            item.pending += n
            first_pending[first] = topic
        else:
            item.active += n
    if first_pending:
        created = Task.objects.filter(sequence__in=first_pending).values_list(
            "sequence", "created_at"
        )
        for sequence, created_at in created:
            found[first_pending[sequence]].oldest_pending = max(now - created_at, timedelta(0))
    return list(found.values())


def _with_finished_text(task: Task) -> Task:
    task.finished_at_text = when(task.finished_at)  # type: ignore[attr-defined]
    return task


def _with_age_text(rows: Iterable[Any]) -> list[Any]:
    """The rows, each with ``age_text``: its heartbeat age for people ("4s")."""
    listed = list(rows)
    for row in listed:
        row.age_text = age(row.age)
    return listed


@admin.register(Dashboard)
class DashboardAdmin(ModelAdmin):
    """The dashboard page (read-only; for users who may view topics or tasks)."""

    #: Seconds between automatic reloads of the page.
    refresh = 15
    #: Failures listed (the latest first); the link shows them all.
    failures_shown = 20

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return any(
            user.has_perm(f"django_tasks_coord.{codename}")
            for codename in ("view_dashboard", "view_topic", "view_task")
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Render the dashboard."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = timezone.now()
        hour_ago = now - timedelta(hours=1)
        failures = Task.objects.filter(state=TaskState.FAILED, finished_at__gte=hour_ago)
        topics = backlog(now)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Tasks dashboard"),
            "opts": self.opts,
            "refresh": self.refresh,
            "now": now,
            "backlog": [item for item in topics if not item.internal],
            "internal_backlog": [item for item in topics if item.internal],
            "charts": throughput(now),
            "now_text": when(now),
            "failures": [
                _with_finished_text(task)
                for task in failures.select_related("owner").order_by("-finished_at")[
                    : self.failures_shown
                ]
            ],
            "failures_count": failures.order_by()[:1000].count(),
            "failures_url": task_list_url(
                state__exact=TaskState.FAILED.value,
                finished_at__gte=hour_ago.isoformat(),
            ),
            "leaders": _with_age_text(
                holders_with_health().exclude(task_id="").order_by("group_id")
            ),
            "nodes": _with_age_text(
                owners_with_health().filter(heartbeat__gte=alive_since()).order_by("name")
            ),
            "bar_width": BAR_WIDTH,
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_tasks_coord/dashboard.html", context)
