"""What the flow limits of a topic see now (:func:`usage`), for the admin's topic page and
the metrics; :mod:`django_tasks_coord.store.flow`, the claim under those limits, re-exports
it."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from django.db.models import Count
from django.db.models.functions import Now

from django_tasks_coord import db
from django_tasks_coord.enums import IN_FLIGHT
from django_tasks_coord.flow import FIELDS, Limits
from django_tasks_coord.models import FlowStart, Task, Topic

__all__ = ["usage"]


def usage(name: str, using: str | None = None) -> dict[str, Any]:
    """What the limits of topic ``name`` see now (for the admin and the metrics): tasks in
    flight (``active``) and starts in the current rate window (``started``, each key within
    its own rate's period, else the longest of the topic's), each per key, and the same for
    the topic as a whole (``total_active``; ``total_started`` within the total rate's
    period, else the longest)."""
    using = using or db.alias()
    row = Topic.objects.using(using).filter(name=name).annotate(db_now=Now())
    found = row.values_list(*FIELDS, "db_now").first()
    if found is None:
        return {
            "limits": Limits(),
            "active": {},
            "started": {},
            "total_active": 0,
            "total_started": 0,
        }
    *fields, now = found
    limits = Limits.of(*fields)
    active: Counter[str] = Counter()
    in_flight = Task.objects.using(using).filter(topic_id=name, state__in=IN_FLIGHT)
    for key, n in (
        in_flight.values("concurrency_key")
        .annotate(n=Count("pk"))
        .values_list("concurrency_key", "n")
    ):
        active[key if limits.key else ""] += n
    started: Counter[str] = Counter()
    total_started = 0
    rates = limits.rates()
    if rates:
        longest = max(rate.period for rate in rates)
        since = now - timedelta(seconds=longest)
        log = FlowStart.objects.using(using).filter(topic=name, at__gt=since)
        total_period = limits.total_rate.period if limits.total_rate else longest
        for key, at, count in log.values_list("key", "at", "count"):
            key = key if limits.key else ""
            own = limits.for_key(key).rate
            if at > now - timedelta(seconds=own.period if own else longest):
                started[key] += count
            if at > now - timedelta(seconds=total_period):
                total_started += count
    return {
        "limits": limits,
        "active": dict(active),
        "started": dict(started),
        "total_active": sum(active.values()),
        "total_started": total_started,
    }
