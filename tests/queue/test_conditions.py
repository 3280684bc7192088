"""Poll conditions: per-identifier ordering (SINGULAR_BY_IDENTIFIER and its two stricter variants)."""

import pytest

from django_tasks_coord import queue
from django_tasks_coord.queue import Condition, Decision, Result, TaskState

pytestmark = pytest.mark.django_db

SINGULAR = Condition.SINGULAR_BY_IDENTIFIER
ON_FAILURE = Condition.SINGULAR_BY_IDENTIFIER_SUSPEND_ON_FAILURE
UNTIL_SUCCESS = Condition.SINGULAR_BY_IDENTIFIER_SUSPEND_UNTIL_SUCCESS


def polled(topic, condition, limit=10):
    return [(t.identifier, t.payload) for t in queue.poll(topic, limit, condition=condition)]


def run_first(topic, result):
    """Poll the oldest task without a condition and complete it with ``result``."""
    (task,) = queue.poll(topic, 1)
    queue.complete(task, Decision(result))
    return task


@pytest.mark.parametrize("condition", [SINGULAR, ON_FAILURE, UNTIL_SUCCESS])
def test_one_task_per_identifier_at_a_time(topic, condition):
    queue.push_many(topic, [("a", 1), ("a", 2), ("b", 1), ("a", 3)])
    assert polled(topic, condition) == [("a", 1), ("b", 1)]
    # a#1 is active: a#2 stays blocked
    assert polled(topic, condition) == []


@pytest.mark.parametrize("condition", [SINGULAR, ON_FAILURE, UNTIL_SUCCESS])
def test_next_task_of_identifier_after_success(topic, condition):
    queue.push_many(topic, [("a", 1), ("a", 2)])
    run_first(topic, Result.SUCCESS)
    assert polled(topic, condition) == [("a", 2)]


def test_without_condition_identifiers_do_not_block(topic):
    queue.push_many(topic, [("a", 1), ("a", 2)])
    assert polled(topic, None) == [("a", 1), ("a", 2)]


@pytest.mark.parametrize(
    ("result", "singular", "on_failure", "until_success"),
    [
        (Result.SUCCESS, True, True, True),
        (Result.FILTER, True, True, True),
        (Result.FAILURE, True, False, False),
        (Result.SUSPENSION, True, True, False),
    ],
)
def test_what_an_earlier_completed_task_allows(topic, result, singular, on_failure, until_success):
    queue.push_many(topic, [("a", 1), ("a", 2)])
    run_first(topic, result)
    for condition, expected in (
        (SINGULAR, singular),
        (ON_FAILURE, on_failure),
        (UNTIL_SUCCESS, until_success),
    ):
        tasks = queue.poll(topic, 10, condition=condition)
        assert bool(tasks) is expected, condition
        for task in tasks:  # give it back so the next condition sees the same queue
            queue.release(task)


def test_pending_earlier_task_blocks_later_even_in_lifo(topic):
    queue.push_many(topic, [("a", 1), ("a", 2)])
    tasks = queue.poll(topic, 10, order="lifo", condition=SINGULAR)
    assert [(t.identifier, t.payload) for t in tasks] == [("a", 1)]


def test_only_the_latest_earlier_task_counts(topic):
    queue.push_many(topic, [("a", 1), ("a", 2), ("a", 3)])
    run_first(topic, Result.FAILURE)
    run_first(topic, Result.SUCCESS)
    assert polled(topic, UNTIL_SUCCESS) == [("a", 3)]


def test_redundant_and_canceled_tasks_never_block(topic):
    queue.push_many(topic, [("a", 1), ("a", 2)])
    run_first(topic, Result.FAILURE)
    second = queue.poll(topic)[0]
    queue.cancel(second)  # ACTIVE: a cancel request; it ends CANCELED once completed
    assert queue.complete(second, Result.SUCCESS).state == TaskState.CANCELED
    queue.push(topic, "a", 3, insertion="supersede")  # nothing pending to supersede
    queue.push(topic, "a", 4, insertion="supersede")  # a#3 becomes redundant
    # latest relevant earlier task is a#1 (FAILED): blocked under ON_FAILURE, not under SINGULAR
    assert polled(topic, ON_FAILURE) == []
    assert polled(topic, SINGULAR) == [("a", 4)]


def test_condition_by_name(topic):
    queue.push_many(topic, [("a", 1), ("a", 2)])
    assert len(queue.poll(topic, 10, condition="singular_by_identifier")) == 1
