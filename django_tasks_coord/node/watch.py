"""The work watch: where nothing announces new work, a waiting node looks for it often, cheaply.

On PostgreSQL ``NOTIFY`` wakes a node the moment work is pushed. MariaDB/MySQL and SQLite
have no such channel (nor has PostgreSQL with ``LISTEN_NOTIFY`` off): there a node that
found nothing to claim asks the database, every :meth:`WorkWatch.period`, one question
of one statement: how many due tasks are waiting in its topics (paused ones aside), and
the highest of their sequences. When the answer changes (a push by another process, a
task released or returned to the queue, a delayed one falling due, a topic resumed), the
dispatcher claims at once; otherwise it goes on waiting, and its full polls (topics,
claims, the next delayed task) back off up to ``NOTIFIED_POLL_INTERVAL``, as on
PostgreSQL.

``WATCH_INTERVAL`` is how often the nodes of a cluster look, together: of ``N`` live
nodes each looks every ``N x WATCH_INTERVAL``, so ``N`` idle nodes cost the database one
statement per ``WATCH_INTERVAL``, not ``N``. A node alone finds a pushed task within
``WATCH_INTERVAL``; in a cluster, the first node to look (after ``WATCH_INTERVAL`` on
average) claims it. The count, not only the highest sequence, is compared: a task whose
transaction commits after a later-numbered one is still seen.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import Count, Max

from django_tasks_coord import db
from django_tasks_coord.models import Task
from django_tasks_coord.node.state import NodeState

#: What the watch compares: the number of due waiting tasks and their highest sequence.
Seen = tuple[int, int | None]


class WorkWatch:
    """A dispatcher's watch for work nobody announces (see the module)."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self.interval = state.config.watch_interval
        self._seen: Seen | None = None

    @property
    def active(self) -> bool:
        """Whether this node watches: ``WATCH_INTERVAL`` is set and no ``LISTEN``
        connection stands for it (PostgreSQL with ``LISTEN_NOTIFY`` on has one)."""
        return self.interval > 0 and self.state.listener is None

    def period(self) -> float:
        """Seconds between two looks of this node: ``WATCH_INTERVAL`` times the live nodes
        the last sweep counted (so that the cluster looks about every ``WATCH_INTERVAL``)."""
        return self.interval * max(self.state.live_nodes, 1)

    def look(self, topics: Sequence[str]) -> bool:
        """Ask the database (one statement); whether the answer differs from the last one.

        A look with nothing to compare with (the first) only remembers the answer.
        """
        rows = Task.objects.using(db.alias()).filter(topic_id__in=list(topics), topic__paused=False)
        found = rows.due().aggregate(waiting=Count("pk"), last=Max("pk"))
        seen: Seen = (found["waiting"], found["last"])
        changed = self._seen is not None and seen != self._seen
        self._seen = seen
        return changed

    def expect_nothing(self) -> None:
        """A claim round just found nothing to claim: as far as it saw, nothing waited.

        The next look compares with that, so a task pushed between the claim and that
        look counts as a change (tasks that wait but cannot be claimed, held back by a
        condition, cost one claim round; the look before it remembers them).
        """
        self._seen = (0, None)
