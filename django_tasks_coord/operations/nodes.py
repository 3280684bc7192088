"""Nodes and leaders: who is alive, how old its heartbeat is, what it holds.

The annotations (:func:`owners_with_health`, :func:`holders_with_health`) compare
heartbeats with the database clock, like every liveness decision of the nodes; the
admin shows the same columns.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import (
    BooleanField,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Now

from django_tasks_coord import db
from django_tasks_coord.conf import app_settings
from django_tasks_coord.enums import IN_FLIGHT
from django_tasks_coord.models import HealthCheck, Owner, Task, TokenHolder
from django_tasks_coord.operations.selection import iso


def age_of(field: str) -> ExpressionWrapper[Any]:
    """How long ago ``field`` was (database clock, like every heartbeat comparison)."""
    return ExpressionWrapper(Now() - F(field), output_field=DurationField())


def alive_since() -> Any:
    """The oldest heartbeat that is still alive: now minus ``LIVENESS_INTERVAL`` (database clock)."""
    return db.ago(app_settings.liveness_interval)


def alive_of(field: str) -> ExpressionWrapper[Any]:
    """``field`` is within ``LIVENESS_INTERVAL`` of the database clock."""
    recent = Q(**{f"{field}__gte": alive_since()})
    return ExpressionWrapper(recent, output_field=BooleanField())


def owners_with_health() -> QuerySet[Owner]:
    """Owners with ``age`` (of the heartbeat), ``alive`` and ``held`` (tasks in flight)."""
    held = (
        Task.objects.filter(owner_id=OuterRef("pk"), state__in=IN_FLIGHT)
        .order_by()
        .values("owner_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Owner.objects.annotate(
        age=age_of("heartbeat"), alive=alive_of("heartbeat"), held=Subquery(held)
    )


def holders_with_health() -> QuerySet[TokenHolder]:
    """Token holders with the ``age`` of the holder's heartbeat in the group, and ``alive``."""
    beat = HealthCheck.objects.filter(
        group_id=OuterRef("group_id"), task_id=OuterRef("task_id")
    ).values("last_heartbeat")[:1]
    return TokenHolder.objects.annotate(holder_beat=Subquery(beat)).annotate(
        age=age_of("holder_beat"), alive=alive_of("holder_beat")
    )


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else round(max(delta.total_seconds(), 0.0), 3)


def list_nodes() -> list[dict[str, Any]]:
    """Every registered node (owner), alive or dead, with its heartbeat age and tasks held."""
    return [
        {
            "name": o.name,
            "host": o.host,
            "pid": o.pid,
            "alive": bool(getattr(o, "alive", False)),
            "heartbeat_age_seconds": _seconds(getattr(o, "age", None)),
            "tasks_held": getattr(o, "held", None) or 0,
            "started_at": iso(o.started_at),
            "heartbeat": iso(o.heartbeat),
        }
        for o in owners_with_health().using(db.alias()).order_by("name")
    ]


def list_leaders() -> list[dict[str, Any]]:
    """Every coordination group with its token holder (the leader, "" if none), term and health."""
    return [
        {
            "group": h.group_id,
            "leader": h.task_id or None,
            "term": h.term,
            "alive": bool(h.task_id) and bool(getattr(h, "alive", False)),
            "heartbeat_age_seconds": _seconds(getattr(h, "age", None)) if h.task_id else None,
            "acquired_at": iso(h.acquired_at),
            "released_at": iso(h.released_at),
        }
        for h in holders_with_health().using(db.alias()).order_by("group_id")
    ]
