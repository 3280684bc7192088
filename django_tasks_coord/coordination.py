"""Warm backup: one leader per coordination group, elected through ``token_holder``.

Every node of a group heartbeats its ``health_check`` row. The token holder is the
leader; when its heartbeat is older than the liveness interval (database clock), a
standby takes the token and the term increments, inside a transaction that locks the
``token_holder`` row, so two candidates never both win. A deposed leader finds its
term outdated: :func:`fenced` refuses its writes.

::

    from django_tasks_coord import coordination

    coordination.join("billing", "node-1")
    term = coordination.try_acquire("billing", "node-1", liveness=timedelta(seconds=30))
    with coordination.fenced("billing", "node-1", term):
        ...  # writes that must only happen while node-1 is still the leader
    coordination.leader("billing")   # Leader(node_id='node-1', term=3, last_heartbeat=...)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, OperationalError
from django.db.models import DurationField, ExpressionWrapper, F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Now

from django_tasks_coord import db
from django_tasks_coord.conf import app_settings
from django_tasks_coord.exceptions import FencedError, InvalidArgumentError, TokenBusyError
from django_tasks_coord.models import HealthCheck, TokenHolder

logger = logging.getLogger(__name__)

#: NOTIFY payload prefix announcing that a group's token was released.
RELEASED = "tasks_coord.token:"


@dataclass(frozen=True)
class Leader:
    """A group's current token holder."""

    node_id: str
    term: int
    last_heartbeat: datetime | None


def _check(group: str, node_id: str) -> None:
    for argument, value, limit in (("group", group, 100), ("node_id", node_id, 200)):
        if not isinstance(value, str) or not 0 < len(value) <= limit:
            raise InvalidArgumentError(
                f"{argument} must be a str of 1 to {limit} characters, not {value!r}."
            )


def _membership(group: str, node_id: str) -> QuerySet[HealthCheck]:
    """``node_id``'s ``health_check`` row in ``group`` (at most one)."""
    return HealthCheck.objects.using(db.alias()).filter(task_id=node_id, group_id=group)


def join(group: str, node_id: str) -> None:
    """Register ``node_id`` as a member of ``group`` (its heartbeat starts now)."""
    _check(group, node_id)
    with db.write_transaction():
        if not _membership(group, node_id).update(last_heartbeat=Now()):
            HealthCheck.objects.using(db.alias()).create(task_id=node_id, group_id=group)


def heartbeat(group: str, node_id: str) -> bool:
    """Refresh ``node_id``'s heartbeat in ``group``; False if it is not a member (any more)."""
    return _membership(group, node_id).update(last_heartbeat=Now()) == 1


def leave(group: str, node_id: str) -> None:
    """Release the token if ``node_id`` holds it, and drop its membership."""
    release(group, node_id)
    _membership(group, node_id).delete()


def forget_dead(older_than: timedelta) -> int:
    """Delete memberships whose last heartbeat is older than ``older_than``; return how many.

    A node killed without a graceful stop leaves its ``health_check`` row behind. For
    elections it counts as dead after the liveness interval anyway; nodes clear such
    rows (at ten liveness intervals) so the table lists live members only. A node that
    was merely frozen rejoins at its next heartbeat.
    """
    stale = HealthCheck.objects.using(db.alias()).filter(last_heartbeat__lt=db.ago(older_than))
    deleted, _ = stale.delete()
    if deleted:
        logger.info(
            "Forgot %s group membership(s) without a heartbeat for %s.", deleted, older_than
        )
    return deleted


def try_acquire(group: str, node_id: str, liveness: timedelta) -> int | None:
    """Become (or stay) ``group``'s leader if possible; return the term held, else None.

    ``node_id`` takes the token when nobody holds it, or when the holder's heartbeat
    is older than ``liveness`` (or it left the group); the term then increments. The
    ``token_holder`` row is locked for the decision, so concurrent candidates are
    serialized and exactly one wins. The lock is taken with ``NOWAIT``: if another
    process holds it (possibly a frozen one), :class:`TokenBusyError` is raised at
    once instead of blocking the caller's heartbeats.
    """
    _check(group, node_id)
    using = db.alias()
    try:
        try:
            return _acquire(group, node_id, liveness, using)
        finally:
            _unbound_lock_window()
    except OperationalError as exc:
        if db.locks_whole_database(db.connection()):  # "database is locked", not NOWAIT's refusal
            raise
        raise TokenBusyError(f"The token of group {group!r} is locked by another process.") from exc


def _acquire(group: str, node_id: str, liveness: timedelta, using: str) -> int | None:
    holders = TokenHolder.objects.using(using)
    nowait = db.connection().features.has_select_for_update_nowait
    with db.write_transaction():
        _bound_lock_window(liveness)
        holder = holders.select_for_update(nowait=nowait).filter(group_id=group).first()
        if holder is None:
            try:
                with db.write_transaction():
                    holders.create(group_id=group, task_id=node_id, term=1, acquired_at=Now())
            except IntegrityError:  # another candidate created it first: it won this round
                return None
            logger.info("Node %s elected leader of group %r (term 1).", node_id, group)
            return 1
        if holder.task_id == node_id:
            return holder.term
        alive = _membership(group, holder.task_id).filter(last_heartbeat__gte=db.ago(liveness))
        if holder.task_id and alive.exists():
            return None
        holders.filter(group_id=group).update(
            task_id=node_id, term=holder.term + 1, acquired_at=Now()
        )
    logger.warning(
        "Node %s took over group %r from %s (term %s).",
        node_id,
        group,
        holder.task_id or "nobody (released)",
        holder.term + 1,
        extra={"group": group, "node": node_id, "term": holder.term + 1},
    )
    return holder.term + 1


@dataclass(frozen=True)
class Lease:
    """Who holds a group's token, under which term, and for how much longer."""

    node_id: str  #: empty when the holder released the token
    term: int
    #: Seconds until the token may be taken over, by the database clock (0: now).
    seconds_left: float


def lease(group: str, liveness: timedelta) -> Lease | None:
    """Read ``group``'s token without locking it (None: it was never taken).

    Nodes call this every heartbeat and lock the token (:func:`try_acquire`) only
    when a takeover is possible (``seconds_left == 0``): the holder renews nothing
    in ``token_holder`` (its ``health_check`` heartbeat is its lease), and a
    standby that knows when the lease runs out tries again at that moment instead
    of at its next regular heartbeat, so a dead leader is replaced within about
    ``liveness``, not ``liveness`` plus up to one heartbeat.
    """
    using = db.alias()
    holder_age = (
        HealthCheck.objects.using(using)
        .filter(group_id=group, task_id=OuterRef("task_id"))
        .annotate(age=ExpressionWrapper(Now() - F("last_heartbeat"), output_field=DurationField()))
        .values("age")[:1]
    )
    row = (  # one statement: the token and its holder's heartbeat age
        TokenHolder.objects.using(using)
        .filter(group_id=group)
        .annotate(age=Subquery(holder_age, output_field=DurationField()))
        .values_list("task_id", "term", "age")
        .first()
    )
    if row is None:
        return None
    holder_id, term, age = row
    if not holder_id:
        return Lease(node_id="", term=term, seconds_left=0.0)
    # Clamped: SQLite's clock has millisecond precision, so a heartbeat written an instant
    # ago can look a fraction of a millisecond into the future.
    left = (
        0.0
        if age is None
        else min(max((liveness - age).total_seconds(), 0.0), liveness.total_seconds())
    )
    return Lease(node_id=holder_id, term=term, seconds_left=left)


def release(group: str, node_id: str) -> bool:
    """Give up the token if ``node_id`` holds it (graceful stop); standbys take it at once."""
    with db.write_transaction():
        released = (
            TokenHolder.objects.using(db.alias())
            .filter(group_id=group, task_id=node_id)
            .update(task_id="", released_at=Now())
        )
        if released:
            db.notify(db.connection(), RELEASED + group)
    if released:
        logger.info("Node %s released the token of group %r.", node_id, group)
    return released == 1


def leader(group: str) -> Leader | None:
    """The node holding ``group``'s token, its term and last heartbeat; None if nobody holds it."""
    holder = (
        TokenHolder.objects.using(db.alias()).filter(group_id=group).exclude(task_id="").first()
    )
    if holder is None:
        return None
    beat = _membership(group, holder.task_id).values_list("last_heartbeat", flat=True).first()
    return Leader(holder.task_id, holder.term, beat)


def is_current(group: str, node_id: str, term: int) -> bool:
    """Whether ``node_id`` still holds ``group``'s token under ``term``."""
    holders = TokenHolder.objects.using(db.alias())
    return holders.filter(group_id=group, task_id=node_id, term=term).exists()


def _bound_lock_window(limit: timedelta) -> None:
    """Let the server end this transaction if its process freezes in it for ``limit``.

    The token row is locked only for an instant, but a process stopped (SIGSTOP, a
    VM pause) in that instant would keep it locked; with this the server rolls the
    frozen transaction back and the others can elect a new leader. Where the database
    has such a setting (:func:`django_tasks_coord.db.set_lock_window`);
    :func:`_unbound_lock_window` undoes it once the transaction is over.
    """
    db.set_lock_window(db.connection(), limit)


def _unbound_lock_window() -> None:
    """After a transaction that called :func:`_bound_lock_window`: the session's default back."""
    db.reset_lock_window(db.connection())


def _deposed(group: str, node_id: str, term: int) -> FencedError:
    current = leader(group)
    holder = (
        "the token is free" if current is None else f"{current.node_id} holds term {current.term}"
    )
    return FencedError(
        f"Node {node_id!r} no longer leads group {group!r} under term {term}: {holder}."
    )


def confirm(group: str, node_id: str, term: int) -> None:
    """Inside a transaction: lock the token row and raise :class:`FencedError` unless the
    term still stands. Until that transaction ends no takeover can commit, so what it
    writes commits under ``term`` (the lock is held only from here to the commit)."""
    _bound_lock_window(app_settings.liveness_interval)
    holders = TokenHolder.objects.using(db.alias()).select_for_update()
    if not holders.filter(group_id=group, task_id=node_id, term=term).exists():
        raise _deposed(group, node_id, term)


@contextmanager
def fenced(group: str, node_id: str, term: int) -> Iterator[None]:
    """A transaction whose writes commit only while ``node_id`` leads ``group`` under ``term``.

    The term is checked when the block starts (a deposed leader fails fast) and again,
    under a lock on the ``token_holder`` row, when it ends, right before the commit:
    either your writes commit under this term, or :class:`FencedError` is raised and
    they roll back. No lock is held while your code runs, so a leader that freezes
    inside the block cannot stop the others from electing a new one.
    """
    if not is_current(group, node_id, term):
        raise _deposed(group, node_id, term)
    try:
        with db.write_transaction():
            yield
            confirm(group, node_id, term)
    finally:
        _unbound_lock_window()
