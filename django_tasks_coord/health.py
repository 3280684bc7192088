"""Is a node alive? The check behind ``manage.py tasks_coord_health`` (container probes).

A node is healthy when the database answers and the node's ``Owner`` heartbeat
(written by the node's lifeline every ``HEARTBEAT_FREQUENCY``) is younger than
``LIVENESS_INTERVAL``, or than a given maximum age. Ages are measured on the
database clock, like every liveness decision of the app.

Which node: the one named by ``node_id``, else by ``TASKS_COORD["NODE_ID"]``; without
either, the node running on this host, found by its ``Owner`` row's host and process
id. That lookup suits a probe run next to ``runscheduler`` in the same container or
on the same machine (a Kubernetes ``exec`` probe, a Docker ``HEALTHCHECK``): it needs
nothing written by the node besides its ``Owner`` row, and skips rows left by dead
processes of this host.
"""

from __future__ import annotations

import enum
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError
from django.db.models import QuerySet
from django.db.models.functions import Now

from django_tasks_coord import db
from django_tasks_coord.conf import app_settings
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Owner

__all__ = ["Report", "Status", "check", "process_exists"]


class Status(enum.IntEnum):
    """The outcome of a health check; its value is the command's exit status."""

    HEALTHY = 0
    """The database answers and the node's heartbeat is fresh."""
    DATABASE_UNAVAILABLE = 3
    """The database cannot be reached or queried (also: the app's tables are missing)."""
    NOT_REGISTERED = 4
    """No such node is registered (not started yet, stopped, or declared dead and removed)."""
    STALE_HEARTBEAT = 5
    """The node is registered but its heartbeat is older than the maximum age."""
    AMBIGUOUS = 6
    """Several live nodes run on this host: name one with ``node_id``."""


@dataclass(frozen=True)
class Report:
    """What :func:`check` found. ``reason`` is one line for a human (or a probe's log)."""

    status: Status
    reason: str
    node_id: str | None = None
    age: float | None = None
    """Seconds since the node's last heartbeat (database clock), when it was found."""

    @property
    def healthy(self) -> bool:
        """True when :attr:`status` is :attr:`Status.HEALTHY`."""
        return self.status is Status.HEALTHY


def process_exists(pid: int) -> bool:
    """Whether a process with id ``pid`` runs on this machine (in this PID namespace)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True


def check(
    node_id: str | None = None,
    *,
    pid: int | None = None,
    host: str | None = None,
    max_age: float | timedelta | None = None,
) -> Report:
    """Check one node's heartbeat and the database connection; never raises for either.

    ``node_id`` defaults to ``TASKS_COORD["NODE_ID"]``. Without one, the node is looked
    up on ``host`` (default: this machine's host name) among owners whose process
    ``pid`` is given or, if none is, still runs here. ``max_age`` (seconds or a
    timedelta) defaults to ``LIVENESS_INTERVAL``.
    """
    bound = _seconds(app_settings.LIVENESS_INTERVAL if max_age is None else max_age)
    node_id = node_id or app_settings.NODE_ID
    owner: Owner
    try:
        owners: QuerySet[Owner] = Owner.objects.using(db.alias()).annotate(db_now=Now())
        if node_id:
            found = list(owners.filter(name=node_id))
            if not found:
                return Report(
                    Status.NOT_REGISTERED,
                    f"node {node_id!r} is not registered (not started, stopped, or declared dead)",
                    node_id,
                )
            owner = found[0]
        else:
            lookup = _lookup(owners, host or socket.gethostname(), pid)
            if isinstance(lookup, Report):
                return lookup
            owner = lookup
    except DatabaseError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Report(Status.DATABASE_UNAVAILABLE, f"database unavailable: {first_line}", node_id)
    db_now: datetime = owner.db_now  # type: ignore[attr-defined]  # annotated above
    age = max((db_now - owner.heartbeat).total_seconds(), 0.0)
    if age > bound:
        return Report(
            Status.STALE_HEARTBEAT,
            f"node {owner.name!r}: last heartbeat {age:.1f}s ago, more than {bound:g}s",
            owner.name,
            age,
        )
    return Report(
        Status.HEALTHY,
        f"node {owner.name!r}: last heartbeat {age:.1f}s ago",
        owner.name,
        age,
    )


def _lookup(owners: QuerySet[Owner], host: str, pid: int | None) -> Owner | Report:
    """The live owner of this host (and ``pid``), or the report saying why there is none."""
    candidates = list(owners.filter(host=host).order_by("-started_at"))
    if pid is not None:
        live = [owner for owner in candidates if owner.pid == pid]
        where = f"process {pid} on host {host!r}"
    else:
        live = [owner for owner in candidates if owner.pid and process_exists(owner.pid)]
        where = f"a running process on host {host!r}"
    if not live:
        return Report(
            Status.NOT_REGISTERED, f"no node of {where} is registered{_others(candidates)}"
        )
    pids = sorted({owner.pid for owner in live if owner.pid})
    if len(pids) > 1:
        return Report(
            Status.AMBIGUOUS,
            f"{len(live)} nodes run on host {host!r} ({', '.join(o.name for o in live)}): "
            "name one with --node-id or --pid",
        )
    return live[0]  # the newest row of the process


def _others(candidates: list[Owner]) -> str:
    """What else is registered on the host, each owner said to be running or exited.

    With ``--pid`` the candidates are every owner of the host, live nodes of other
    processes included: only those whose process is gone are called exited.
    """
    if not candidates:
        return ""
    running = [o.name for o in candidates if o.pid and process_exists(o.pid)]
    exited = [o.name for o in candidates if o.name not in running]
    parts = []
    if running:
        parts.append(f"nodes of other running processes: {', '.join(running)}")
    if exited:
        parts.append(f"owners of exited processes: {', '.join(exited)}")
    return f" ({'; '.join(parts)})"


def _seconds(value: float | timedelta) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise InvalidArgumentError(
            f"max_age must be a positive number of seconds or a timedelta, not {value!r}."
        )
    return float(seconds)
