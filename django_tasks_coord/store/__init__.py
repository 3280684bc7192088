"""The task store: the one place that writes rows of the task table.

Every ``INSERT``, ``UPDATE`` and ``DELETE`` on :class:`~django_tasks_coord.models.Task`
goes through a function of this package: inserting (with its NOTIFY), claiming,
finishing (fenced by the claim's ``exec_id``), releasing, cancelling, returning the
work of dead owners to the queue, the attempt log and pruning. The queue, scheduling,
the executor API, owners, revival, the ``django.tasks`` backend and the node call it;
none of them writes task rows itself (``tests/test_task_store_rule.py`` keeps it so).

This module re-exports; the implementation lives in its submodules, one per kind of
write.
"""

from __future__ import annotations

from django_tasks_coord.store.attempts import write_log
from django_tasks_coord.store.completion import Change, write_changes
from django_tasks_coord.store.fencing import held

__all__ = ["Change", "held", "write_changes", "write_log"]
