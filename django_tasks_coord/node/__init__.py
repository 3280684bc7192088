"""The node: what one ``manage.py runscheduler`` process does.

This package re-exports; the implementation lives in its submodules. The node
(:class:`~django_tasks_coord.node.supervisor.Node`) is a supervisor of small duties, each
with an injected clock and a ``tick()``: the dispatcher (:mod:`.dispatcher`), the
execution of tasks (:mod:`.execution`), the lifeline (:mod:`.lifeline`: heartbeat,
sweeps, status line), the group's leadership (:mod:`.leadership`) and the scheduler loop
(:mod:`django_tasks_coord.scheduling.loop`); the completer (:mod:`.completer`) writes
outcomes in batches. See :mod:`.supervisor` for the threads.
"""

from __future__ import annotations

from django_tasks_coord.node.config import NodeConfig
from django_tasks_coord.node.load import RunningMean
from django_tasks_coord.node.supervisor import (
    EXIT_LOST_OWNERSHIP,
    EXIT_OK,
    EXIT_SIDE_TASK_FAILED,
    Node,
)

__all__ = [
    "EXIT_LOST_OWNERSHIP",
    "EXIT_OK",
    "EXIT_SIDE_TASK_FAILED",
    "Node",
    "NodeConfig",
    "RunningMean",
]
