"""The workflow advancer: a node's duty of moving workflows on once their steps' tasks end.

Every node runs one (its own thread). A round (:meth:`WorkflowAdvancer.tick`) is
:func:`django_tasks_coord.workflows.advance`: for each workflow with a step whose task
ended, one short transaction under the workflow's row lock records the outcome and
enqueues the steps now ready. Any node may advance any workflow; a workflow another node
holds is skipped and looked at again soon. The node wakes it when tasks complete here
(:meth:`wake_after_completions`); otherwise it polls, which also catches the tasks other
processes completed: every ``WORKFLOW_POLL_INTERVAL`` seconds after a round that advanced
something, backing off (doubling) to ``MAX_POLL_INTERVAL`` while rounds find nothing, so an
idle node costs little.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError

from django_tasks_coord import db
from django_tasks_coord.node.backoff import IdleBackoff
from django_tasks_coord.node.state import NodeState
from django_tasks_coord.node.wakeup import WakeEvent
from django_tasks_coord.workflows.advance import advance

logger = logging.getLogger("django_tasks_coord.node")

#: How soon to look again at workflows another node held locked.
BUSY_RETRY = 0.05


class WorkflowAdvancer:
    """One node's workflow advancing, one round per :meth:`tick` (see the module)."""

    def __init__(self, state: NodeState, *, interval: float) -> None:
        self.state = state
        #: ``WORKFLOW_POLL_INTERVAL`` 0 turns the node's advancing off (no thread, no
        #: connection): other nodes advance the workflows.
        self.enabled = interval > 0
        self.wake = WakeEvent(state.stopping)
        interval = interval if self.enabled else state.config.max_poll_interval
        self.backoff = IdleBackoff(interval, max(interval, state.config.max_poll_interval))
        self._reconnect = db.Reconnect("Advancing workflows")

    def tick(self) -> float | None:
        """One round; the seconds to sleep before the next (0 while there is more to do)."""
        if self.wake.is_set():  # completions here: steps move, look again soon after
            self.backoff.reset()
        self.wake.clear()
        try:
            done = advance()
        except DatabaseError as exc:  # a lost connection, a deadlock: reconnect, go on
            return self._reconnect.failed(exc)
        self._reconnect.succeeded()
        if done.advanced:
            logger.debug(
                "Advanced %s workflow(s).", done.advanced, extra={"node": self.state.node_id}
            )
            self.backoff.reset()
        if done.more:
            return 0.0
        if done.busy:
            return BUSY_RETRY
        wait = self.backoff.wait
        if not done.advanced:
            self.backoff.idle()
        return wait

    def wake_after_completions(self) -> None:
        """Tasks completed on this node: advance now. A burst node advances on the calling
        thread (the completer's), before the completions count as done, so that it sees the
        steps they make ready before it decides that nothing is due."""
        if not self.enabled:
            return
        if self.state.config.burst:
            # Until nothing is left to advance: a workflow skipped as busy (this node's own
            # advancer thread holds it) is looked at again once that transaction ended, so
            # that the steps it enqueues are committed before the completions count as done.
            while not self.state.stopping.is_set():
                done = db.retry_while_lost(
                    advance, what="Advancing workflows", wait=self.state.wait_unless_forced
                )
                if done.busy and not done.more and self.state.wait_unless_forced(BUSY_RETRY):
                    break
                if not (done.more or done.busy):
                    break
        else:
            self.wake.set()
