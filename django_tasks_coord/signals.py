"""Signals sent on the life of tasks, jobs and leaders, for receivers in your code.

::

    from django.dispatch import receiver
    from django_tasks_coord import signals
    from django_tasks_coord.queue import Result

    @receiver(signals.task_completed)
    def alert_on_failure(sender, task, decision, node, **kwargs):
        if decision.result is Result.FAILURE:
            notify_ops(f"{task} failed: {decision.message}")

Every signal is sent by a ``runscheduler`` node (or whatever runs the same service
code, such as :func:`django_tasks_coord.scheduling.scheduler.submit_due`) *after*
the change is committed to the database, never for a change whose write failed, and
never twice for one change (only the node whose claim wrote an outcome announces it); a
node killed between the commit and the signal never sends it (docs/reference/signals.md:
the outcome in the database is the truth), with
:meth:`~django.dispatch.Signal.send_robust`:
an exception in a receiver is logged (logger ``django_tasks_coord.signals``) and
never breaks the node. Receivers run in the node's threads (the dispatcher, the
completer, the scheduler, the lifeline): keep them short, hand slow work to a queue.

The arguments, besides ``sender``:

| signal | sender | keyword arguments |
| --- | --- | --- |
| ``task_claimed`` | ``Task`` | ``task``, ``node`` (the claiming node's id) |
| ``task_retried`` | ``Task`` | ``task``, ``decision``, ``retry_at``, ``node`` |
| ``task_completed`` | ``Task`` | ``task``, ``decision`` (its ``result`` says how), ``node`` |
| ``job_submitted`` | ``PeriodicTask`` | ``job_id``, ``slot``, ``task`` (the run), ``node`` |
| ``job_finished`` | ``PeriodicTask`` | ``job_id``, ``slot``, ``task``, ``decision`` |
| ``leader_elected`` | ``TokenHolder`` | ``group``, ``node``, ``term`` |
| ``leader_demoted`` | ``TokenHolder`` | ``group``, ``node``, ``term`` (the lost term), ``reason`` |

``task_completed`` covers every final outcome (success, suspension, filter, failure);
a failed attempt that will be retried sends ``task_retried`` instead. Tasks of
Django's ``@task`` API (:mod:`django_tasks_coord.backends`) send these signals too, as
well as Django's own ``task_enqueued``, ``task_started`` and ``task_finished``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

task_claimed = Signal()
"""A node claimed ``task`` (it is ACTIVE, owned by ``node``)."""
task_retried = Signal()
"""An attempt of ``task`` failed with ``decision`` and runs again at ``retry_at``."""
task_completed = Signal()
"""``task`` is completed for good with ``decision`` (any result, failures included)."""
job_submitted = Signal()
"""The scheduler of ``node`` submitted the run ``task`` of job ``job_id`` for ``slot``."""
job_finished = Signal()
"""The run ``task`` of job ``job_id`` (for ``slot``) finished with ``decision``."""
leader_elected = Signal()
"""``node`` now leads ``group`` under ``term``."""
leader_demoted = Signal()
"""``node`` no longer leads ``group`` (it led under ``term``), for ``reason``."""

__all__ = [
    "job_finished",
    "job_submitted",
    "leader_demoted",
    "leader_elected",
    "send",
    "task_claimed",
    "task_completed",
    "task_retried",
]


def send(signal: Signal, sender: type[Any], **kwargs: Any) -> None:
    """Send ``signal`` robustly: a receiver that raises is logged and the others still run."""
    if not signal.has_listeners(sender):
        return
    for receiver, response in signal.send_robust(sender, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "A receiver of a django_tasks_coord signal failed: %r raised %r.",
                receiver,
                response,
                exc_info=(type(response), response, response.__traceback__),
                extra={"signal_receiver": repr(receiver)},
            )
