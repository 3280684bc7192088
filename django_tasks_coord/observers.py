"""A tiny observer interface: what the node's metrics hear that no signal carries.

The signals (:mod:`django_tasks_coord.signals`) say what happened to a task; they do
not say how long a claim's round trip or a handler's run took. The places that time
those (``queue.poll``, ``TaskType.run``) tell every registered :class:`Observer`.
With none registered (the default) each call costs one empty-list check.

:mod:`django_tasks_coord.metrics.node` registers one in a ``runscheduler`` started with
``--metrics-port``. Observers run in the caller's thread (the dispatcher, a worker):
keep them short; an observer that raises is logged and never breaks the node.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_tasks_coord.models import Task

logger = logging.getLogger(__name__)


class Observer:
    """Override what you need; every method does nothing here."""

    def claimed(self, topic: str, tasks: list[Task], seconds: float) -> None:
        """A claim round trip for ``topic`` took ``seconds`` and returned ``tasks`` (maybe none)."""

    def started(self, task: Task, delay: float) -> None:
        """A handler starts running ``task``, ``delay`` seconds after it was due."""

    def ran(self, task: Task, seconds: float) -> None:
        """The handler ran ``task`` for ``seconds`` (a batch: its time shared out per task)."""


_observers: list[Observer] = []


def add(observer: Observer) -> None:
    """Register ``observer`` (once)."""
    if observer not in _observers:
        _observers.append(observer)


def remove(observer: Observer) -> None:
    """Unregister ``observer`` (nothing happens if it is not registered)."""
    if observer in _observers:
        _observers.remove(observer)


def active() -> bool:
    """Whether any observer is registered (callers skip their timing otherwise)."""
    return bool(_observers)


def _each(name: str, *args: Any) -> None:
    for observer in list(_observers):
        try:
            getattr(observer, name)(*args)
        except Exception:  # instrumentation never breaks the node
            logger.exception("Observer %r failed in %s.", observer, name)


def claimed(topic: str, tasks: list[Task], seconds: float) -> None:
    """Tell every observer about a claim round trip (:meth:`Observer.claimed`)."""
    _each("claimed", topic, tasks, seconds)


def started(task: Task, delay: float) -> None:
    """Tell every observer a handler starts ``task`` (:meth:`Observer.started`)."""
    _each("started", task, delay)


def ran(task: Task, seconds: float) -> None:
    """Tell every observer a handler ran ``task`` (:meth:`Observer.ran`)."""
    _each("ran", task, seconds)
