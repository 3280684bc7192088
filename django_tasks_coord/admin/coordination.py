"""Nodes and leaders: owners alive or dead with the tasks they hold; groups with their holder."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from django_tasks_coord.admin.base import ServiceActionsAdmin, age, alive_badge
from django_tasks_coord.admin.topics import task_list_url
from django_tasks_coord.models import HealthCheck, Owner, TokenHolder
from django_tasks_coord.operations import (  # the read side shared with manage.py tasks_coord
    age_of,
    alive_of,
    alive_since,
    holders_with_health,
    owners_with_health,
)


class AliveFilter(admin.SimpleListFilter):
    """Alive (heartbeat within ``LIVENESS_INTERVAL``) or dead; served by the heartbeat index."""

    title = _("liveness")
    parameter_name = "alive"
    field = "heartbeat"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("1", _("alive")), ("0", _("dead"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        bound = Q(**{f"{self.field}__gte": alive_since()})
        if self.value() == "1":
            return queryset.filter(bound)
        if self.value() == "0":
            return queryset.exclude(bound)
        return queryset


class MemberAliveFilter(AliveFilter):
    field = "last_heartbeat"


@admin.register(Owner)
class OwnerAdmin(ServiceActionsAdmin):
    """Registered nodes. A dead one is reaped by the next node's sweep (its tasks freed)."""

    list_display = (
        "name",
        "alive_flag",
        "heartbeat_age",
        "tasks_held",
        "host",
        "pid",
        "started_at",
    )
    list_filter = (AliveFilter,)
    search_fields = ("name", "host")
    readonly_fields = (
        "name",
        "host",
        "pid",
        "started_at",
        "heartbeat",
        "heartbeat_age",
        "alive_flag",
        "tasks_held",
    )
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Owner]:
        return owners_with_health()

    @admin.display(description=_("alive"), ordering="-heartbeat")
    def alive_flag(self, obj: Owner) -> str:
        return alive_badge(bool(getattr(obj, "alive", False)))

    @admin.display(description=_("heartbeat age"), ordering="-heartbeat")
    def heartbeat_age(self, obj: Owner) -> str:
        delta: timedelta | None = getattr(obj, "age", None)
        return age(delta)

    @admin.display(description=_("tasks held"), ordering="held")
    def tasks_held(self, obj: Owner) -> Any:
        n = getattr(obj, "held", None) or 0
        return format_html('<a href="{}">{}</a>', task_list_url(owner__id__exact=obj.pk), n)


@admin.register(TokenHolder)
class TokenHolderAdmin(ServiceActionsAdmin):
    """Coordination groups: who holds the token (the leader), under which term, how fresh."""

    list_display = (
        "group_id",
        "holder",
        "term",
        "holder_alive",
        "holder_heartbeat_age",
        "acquired_at",
        "released_at",
    )
    search_fields = ("group_id", "task_id")
    readonly_fields = (
        "group_id",
        "holder",
        "term",
        "holder_alive",
        "holder_heartbeat_age",
        "acquired_at",
        "released_at",
    )
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[TokenHolder]:
        return holders_with_health()

    @admin.display(description=_("holder (node id)"), ordering="task_id")
    def holder(self, obj: TokenHolder) -> str:
        return obj.task_id or "-"

    @admin.display(description=_("holder alive"))
    def holder_alive(self, obj: TokenHolder) -> str:
        if not obj.task_id:
            return "-"
        return alive_badge(bool(getattr(obj, "alive", False)))

    @admin.display(description=_("heartbeat age"), ordering="-holder_beat")
    def holder_heartbeat_age(self, obj: TokenHolder) -> str:
        delta: timedelta | None = getattr(obj, "age", None)
        return age(delta) if obj.task_id else "-"


@admin.register(HealthCheck)
class HealthCheckAdmin(ServiceActionsAdmin):
    """Group memberships: every node of a group and its heartbeat."""

    list_display = ("group_id", "task_id", "alive_flag", "heartbeat_age", "last_heartbeat")
    list_filter = ("group_id", MemberAliveFilter)
    search_fields = ("task_id", "group_id")
    readonly_fields = ("group_id", "task_id", "last_heartbeat", "heartbeat_age", "alive_flag")
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[HealthCheck]:
        rows: QuerySet[HealthCheck] = super().get_queryset(request)
        return rows.annotate(age=age_of("last_heartbeat"), alive=alive_of("last_heartbeat"))

    @admin.display(description=_("alive"), ordering="-last_heartbeat")
    def alive_flag(self, obj: HealthCheck) -> str:
        return alive_badge(bool(getattr(obj, "alive", False)))

    @admin.display(description=_("heartbeat age"), ordering="-last_heartbeat")
    def heartbeat_age(self, obj: HealthCheck) -> str:
        delta: timedelta | None = getattr(obj, "age", None)
        return age(delta)
