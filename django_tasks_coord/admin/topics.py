"""Topics: queue depth by state, oldest pending age, paused flag; pause and resume; retention;
flow control (rate and concurrency limits, their key, fairness)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    OuterRef,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce, Now
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from django_tasks_coord import flow, queue, retention, topics
from django_tasks_coord.admin.base import ServiceActionsAdmin, age, run_service
from django_tasks_coord.enums import IN_FLIGHT, TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task, Topic
from django_tasks_coord.store import flow as flow_claims


def _count_of(tasks: QuerySet[Task]) -> Coalesce:
    """A correlated ``COUNT(*)`` of ``tasks`` (filtered on ``OuterRef("name")``), 0 if none."""
    counted = tasks.order_by().values("topic_id").annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted), Value(0))


def _total(limits: flow.Limits) -> str:
    """The topic-wide limits in words (without a key, the per-key ones hold for all too)."""
    total = flow.Limits(limits.total_rate, limits.total_concurrency)
    if not limits.key:
        rates = [r for r in (limits.rate, limits.total_rate) if r is not None]
        counts = [c for c in (limits.concurrency, limits.total_concurrency) if c is not None]
        total = flow.Limits(
            min(rates, key=lambda r: r.count / r.period, default=None), min(counts, default=None)
        )
    return str(total)


def task_list_url(**params: Any) -> str:
    """The task changelist filtered by ``params`` (admin filter parameters)."""
    url = reverse("admin:django_tasks_coord_task_changelist")
    return f"{url}?{urlencode(params)}" if params else url


class TopicForm(forms.ModelForm):  # type: ignore[type-arg]
    """The topic's editable fields, the flow limits checked as :func:`flow.set_limits` does."""

    class Meta:
        model = Topic
        fields = (
            *retention.LIMITS,
            *topics.LIMIT_FIELDS,
        )

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        try:
            flow.validated(**_limit_arguments(data), topic=self.instance.name or None)
        except InvalidArgumentError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data


def _limit_arguments(data: dict[str, Any]) -> dict[str, Any]:
    """The arguments of :func:`flow.set_limits` that the form's ``data`` stands for."""
    return {
        "rate": data.get("rate_limit") or None,
        "concurrency": data.get("concurrency_limit"),
        "key": data.get("limit_key") or "",
        "fair": bool(data.get("fair")),
        "total_rate": data.get("total_rate_limit") or None,
        "total_concurrency": data.get("total_concurrency_limit"),
        "key_limits": data.get("key_limits") or None,
    }


@admin.register(Topic)
class TopicAdmin(ServiceActionsAdmin):
    """Topics with their backlog; pause and resume them (every node stops within one poll);
    edit their retention policy (users with ``change_topic``)."""

    list_display = (
        "name",
        "status",
        "pending_count",
        "in_flight_count",
        "oldest_pending_age",
        "consecutive_failures",
        "limits",
    )
    form = TopicForm
    list_filter = ("paused",)
    search_fields = ("name",)
    actions = ("pause", "resume")
    object_actions = ("pause", "resume")
    readonly_fields = ("name", "status", "consecutive_failures", "created_at", "tasks_by_state")
    fieldsets = (
        (None, {"fields": readonly_fields}),
        (
            _("Flow control"),
            {
                "fields": (
                    ("rate_limit", "concurrency_limit"),
                    ("limit_key", "fair"),
                    ("total_rate_limit", "total_concurrency_limit"),
                    "key_limits",
                    "flow_usage",
                ),
                "description": _(
                    "Limits that hold across all nodes, from the next claim on "
                    "(docs/flow-control.md). With a key, each key gets the rate and "
                    "concurrency limits whole (or its own, in the limits of key values), "
                    "and the total limits hold for the topic as a whole."
                ),
            },
        ),
        (
            _("Retention"),
            {
                "fields": (
                    ("keep_completed_days", "keep_completed_rows"),
                    ("keep_failed_days", "keep_failed_rows"),
                ),
                "description": _(
                    "Nodes delete finished tasks past these limits in small batches; empty: "
                    "keep for ever. Completed: succeeded, filtered, canceled and redundant "
                    "tasks. Suspended and unfinished tasks are never deleted."
                ),
            },
        ),
    )

    def has_change_permission(self, request: HttpRequest, obj: Topic | None = None) -> bool:
        """``django_tasks_coord.change_topic``: only the retention and flow control fields are editable."""
        return admin.ModelAdmin.has_change_permission(self, request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Topic | None = None) -> Any:
        return (*super().get_readonly_fields(request, obj), "flow_usage")

    def save_model(self, request: HttpRequest, obj: Topic, form: Any, change: bool) -> None:
        """Write the retention limits through ``retention.set_policy`` and the flow limits
        through ``flow.set_limits`` (updates of those columns only: a pause or a failure count
        written meanwhile is kept)."""
        data = form.cleaned_data
        retention.set_policy(obj, **{name: data[name] for name in retention.LIMITS})
        internal = obj.name.startswith(topics.RESERVED_PREFIX)  # the jobs' topics
        flow.set_limits(obj.name, **_limit_arguments(data), internal=internal)

    @admin.display(description=_("limits"))
    def limits(self, obj: Topic) -> str:
        """The topic's flow limits in words ("rate 50/s, concurrency 3, per identifier,
        total concurrency 20")."""
        return str(flow.Limits.of(*(getattr(obj, name) for name in flow.FIELDS)))

    @admin.display(description=_("in use"))
    def flow_usage(self, obj: Topic) -> Any:
        """Tasks in flight and starts in the current rate window, per key (the detail page)."""
        seen = flow_claims.usage(obj.name)
        limits: flow.Limits = seen["limits"]
        keys = sorted(set(seen["active"]) | set(seen["started"]))[:50]

        def own(key: str) -> str:
            each = limits.for_key(key)
            return str(flow.Limits(each.rate, each.concurrency)) if limits.key else ""

        rows = [
            (key or "-", seen["active"].get(key, 0), seen["started"].get(key, 0), own(key))
            for key in keys
        ]
        rows.append(
            (str(_("all keys")), seen["total_active"], seen["total_started"], _total(limits))
        )
        return format_html(
            '<table class="tc-flow"><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>'
            "{}</table>",
            _("key"),
            _("in flight"),
            _("started in the rate window"),
            _("limits"),
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows),
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Topic]:
        tasks = Task.objects.filter(topic_id=OuterRef("name"))
        oldest = tasks.filter(state=TaskState.PENDING).order_by("sequence").values("created_at")
        rows: QuerySet[Topic] = super().get_queryset(request)
        return rows.annotate(
            pending=_count_of(tasks.filter(state=TaskState.PENDING)),
            in_flight=_count_of(tasks.filter(state__in=IN_FLIGHT)),
            oldest_pending=ExpressionWrapper(
                Now() - Subquery(oldest[:1]), output_field=DurationField()
            ),
        )

    @admin.display(description=_("status"), ordering="paused")
    def status(self, obj: Topic) -> str:
        """ "Paused" or "Running" in words (a check mark for "paused" read as "fine")."""
        return str(_("Paused") if obj.paused else _("Running"))

    @admin.display(description=_("pending"), ordering="pending")
    def pending_count(self, obj: Topic) -> Any:
        n = getattr(obj, "pending", None) or 0
        return format_html(
            '<a href="{}">{}</a>',
            task_list_url(topic__name__exact=obj.name, state__exact=TaskState.PENDING.value),
            n,
        )

    @admin.display(description=_("in flight"), ordering="in_flight")
    def in_flight_count(self, obj: Topic) -> int:
        return getattr(obj, "in_flight", None) or 0

    @admin.display(description=_("oldest pending"), ordering="-oldest_pending")
    def oldest_pending_age(self, obj: Topic) -> str:
        delta: timedelta | None = getattr(obj, "oldest_pending", None)
        return age(delta)

    @admin.display(description=_("tasks by state"))
    def tasks_by_state(self, obj: Topic) -> Any:
        """Every state's count for one topic (the detail page only: one grouped query)."""
        counts = dict(
            Task.objects.for_topic(obj.name)
            .order_by()
            .values_list("state")
            .annotate(n=Count("pk"))
            .values_list("state", "n")
        )
        rows = (
            (
                task_list_url(topic__name__exact=obj.name, state__exact=state.value),
                state.label,
                counts.get(state.value, 0),
            )
            for state in TaskState
        )
        return format_html(
            '<table class="tc-states">{}</table>',
            format_html_join("", '<tr><th><a href="{}">{}</a></th><td>{}</td></tr>', rows),
        )

    def has_pause_permission(self, request: HttpRequest) -> bool:
        """``django_tasks_coord.pause_topic``."""
        return request.user.has_perm("django_tasks_coord.pause_topic")

    def object_action_fits(self, obj: Topic, name: str) -> bool:
        return obj.paused == (name == "resume")

    @admin.action(description=_("Pause"), permissions=["pause"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Topic]) -> None:
        """Pause the selected topics (``queue.pause_topic``)."""
        run_service(self, request, queryset, queue.pause_topic, "Paused")

    @admin.action(description=_("Resume"), permissions=["pause"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Topic]) -> None:
        """Resume the selected topics (``queue.resume_topic``)."""
        run_service(self, request, queryset, queue.resume_topic, "Resumed")
