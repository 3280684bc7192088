"""A handler that completes its own task in a transaction (the claim fence: its side effect
and the completion commit together), then raises. Two sides of one edge:

- the transaction fails after the completion: the completion was rolled back with it. The
  node must see that, not trust the task object the rolled-back ``queue.complete`` changed:
  it records the handler's outcome itself (a failure, retried), so the task is neither left
  ACTIVE under a live node's claim for ever (nothing would expire it, and a workflow step
  waiting on it would never end) nor reported as a failure it was not;
- the transaction committed and the handler raised after (a connection cut as the
  ``COMMIT``'s answer came back): the completion held. The node must report that completion,
  not a failure of a task that succeeded (no ERROR, no failure counted, no error policy).
"""

from __future__ import annotations

import logging

import pytest
from django.db import InterfaceError, transaction

from django_tasks_coord import handlers, queue
from django_tasks_coord.enums import ErrorPolicy, Result, TaskState
from django_tasks_coord.models import Task, Topic
from django_tasks_coord.retry import RetryPolicy
from tests.node.conftest import run
from tests.testapp.models import Run


class AfterCompleting(Exception):
    """Raised in the handler's transaction after it completed its task."""


def test_a_completion_rolled_back_with_its_handlers_transaction_is_recorded_by_the_node(
    make_node, work_topic, caplog
):
    @handlers.consumer("work", retry=RetryPolicy(max_attempts=3, retry_interval=0, jitter=0))
    def fenced(task):
        with transaction.atomic():  # the side effect and the completion: both or neither
            Run.objects.create(
                topic="fenced", identifier=task.identifier, sequence=task.sequence,
                attempt=task.attempts, started_at=task.started_at, pid=0,
            )  # fmt: skip
            queue.complete(task, Result.SUCCESS)
            if task.attempts == 1:
                raise AfterCompleting("the transaction fails after the completion")

    queue.push("work", "a")
    with caplog.at_level(logging.INFO, logger="django_tasks_coord"):
        assert run(make_node()) == 0
    task = Task.objects.get(identifier="a")
    # The first attempt's completion was rolled back: the node retried the task, and the
    # second attempt's completion committed with its side effect.
    assert (task.state, task.attempts) == (TaskState.SUCCEEDED, 2)
    assert list(Run.objects.filter(topic="fenced").values_list("attempt", flat=True)) == [2]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "rolled back" in caplog.text


@pytest.mark.parametrize(
    ("error", "level"),
    [
        # The connection cut as the COMMIT's answer comes back: part of the outage, INFO.
        (InterfaceError("connection already closed"), logging.INFO),
        (RuntimeError("a bug after the commit"), logging.WARNING),
    ],
    ids=["connection-lost", "other"],
)
def test_a_handler_that_raises_after_its_completion_committed_leaves_the_task_completed(
    make_node, work_topic, caplog, error, level
):
    @handlers.consumer(
        "work",
        retry=RetryPolicy(max_attempts=3, retry_interval=0, jitter=0),
        error_policy=ErrorPolicy.LOG_AND_TERMINATE,  # a failure would pause the topic
    )
    def fenced(task):
        with transaction.atomic():
            Run.objects.create(
                topic="fenced", identifier=task.identifier, sequence=task.sequence,
                attempt=task.attempts, started_at=task.started_at, pid=0,
            )  # fmt: skip
            queue.complete(task, Result.SUCCESS)
        raise error  # after the completion committed

    queue.push("work", "a")
    node = make_node()
    with caplog.at_level(logging.INFO, logger="django_tasks_coord"):
        assert run(node) == 0
    task = Task.objects.get(identifier="a")
    assert (task.state, task.attempts, task.error) == (TaskState.SUCCEEDED, 1, None)
    assert list(Run.objects.filter(topic="fenced").values_list("attempt", flat=True)) == [1]
    assert [
        (r.levelno, r.exc_info is not None)
        for r in caplog.records
        if r.levelno >= logging.WARNING or "completion held" in r.getMessage()
    ] == [(level, level == logging.WARNING)], caplog.text  # a traceback for a bug only
    assert (node.stats["processed"], node.stats["failed"]) == (1, 0)
    topic = Topic.objects.get(name="work")
    assert (topic.paused, topic.consecutive_failures) == (False, 0)
