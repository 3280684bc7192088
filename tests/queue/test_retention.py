"""Per-topic retention policies (django_tasks_coord.retention): what goes, what stays, in batches."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_tasks_coord import queue, retention
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError, UnknownTopicError
from django_tasks_coord.models import Task, Topic
from tests.conftest import skip_unless_row_locks
from tests.factories import OwnerFactory, TaskFactory, TopicFactory

pytestmark = pytest.mark.django_db

COMPLETED = (TaskState.SUCCEEDED, TaskState.FILTERED, TaskState.CANCELED, TaskState.REDUNDANT)


def finished(topic: Topic | str, state: TaskState, *, days: float = 0, n: int = 1) -> list[Task]:
    """``n`` tasks of ``topic`` in ``state`` that finished ``days`` ago (created a minute before)."""
    when = timezone.now() - timedelta(days=days)
    tasks = TaskFactory.create_batch(
        n, topic=TopicFactory(name=str(topic)), state=state, finished_at=when
    )
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(created_at=when - timedelta(minutes=1))
    return tasks


def unfinished(topic: Topic | str, *, days: float) -> list[Task]:
    """A pending, a requested and an active task of ``topic``, created ``days`` ago."""
    topic = TopicFactory(name=str(topic))
    tasks = [
        TaskFactory(topic=topic, state=TaskState.PENDING),
        TaskFactory(topic=topic, state=TaskState.REQUESTED, exec_id=uuid.uuid4()),
        TaskFactory(
            topic=topic, state=TaskState.ACTIVE, owner=OwnerFactory(), exec_id=uuid.uuid4()
        ),
    ]
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(
        created_at=timezone.now() - timedelta(days=days)
    )
    return tasks


def left(topic: str = "jobs") -> set[int]:
    return set(Task.objects.filter(topic_id=topic).values_list("pk", flat=True))


def pks(*groups: list[Task]) -> set[int]:
    return {task.pk for group in groups for task in group}


# --- policies --------------------------------------------------------------------------------


def test_set_policy_stores_the_limits_and_replaces_the_previous_policy(topic):
    policy = retention.set_policy(topic, keep_completed_days=7, keep_failed_rows=100)
    assert policy == retention.Policy("jobs", 7, None, None, 100)
    assert retention.get_policy("jobs") == policy
    assert (topic.keep_completed_days, topic.keep_failed_rows) == (7, 100)  # the instance too
    assert retention.set_policy("jobs", keep_completed_rows=0) == retention.Policy("jobs", None, 0)
    stored = Topic.objects.get(name="jobs")
    assert (stored.keep_completed_days, stored.keep_completed_rows) == (None, 0)
    retention.set_policy("jobs")
    assert not retention.get_policy("jobs").is_set


def test_queue_re_exports_set_policy_as_set_retention(topic):
    queue.set_retention(topic, keep_failed_days=30)
    assert retention.get_policy(topic).keep_failed_days == 30


@pytest.mark.parametrize("value", [-1, 1.5, "7", True, 2**31])
@pytest.mark.parametrize(
    "limit", ["keep_completed_days", "keep_completed_rows", "keep_failed_days", "keep_failed_rows"]
)
def test_set_policy_refuses_what_is_not_a_non_negative_int(topic, limit, value):
    retention.set_policy(topic, keep_failed_days=3)
    with pytest.raises(InvalidArgumentError, match=limit):
        retention.set_policy(topic, **{limit: value})
    assert retention.get_policy(topic).keep_failed_days == 3  # nothing changed


def test_set_policy_needs_a_registered_topic(db):
    with pytest.raises(UnknownTopicError, match="nope"):
        retention.set_policy("nope", keep_completed_days=1)


def test_policies_lists_the_topics_with_a_policy_in_one_query(topic, django_assert_num_queries):
    queue.register_topic("other")
    queue.register_topic("zeta")
    retention.set_policy("zeta", keep_failed_rows=5)
    retention.set_policy("other", keep_completed_days=0)
    with django_assert_num_queries(1):
        assert [p.topic for p in retention.policies()] == ["other", "zeta"]


def test_apply_refuses_bad_batch_arguments(topic):
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        retention.apply(batch_size=0)
    with pytest.raises(InvalidArgumentError, match="max_batches"):
        retention.apply(max_batches=0)


# --- what goes, what stays -------------------------------------------------------------------


def test_completed_days_delete_old_finished_tasks_of_the_completed_states(topic):
    old = [finished(topic, state, days=10) for state in COMPLETED]
    young = [finished(topic, state, days=5) for state in COMPLETED]
    old_failed = finished(topic, TaskState.FAILED, days=10)
    old_suspended = finished(topic, TaskState.SUSPENDED, days=10)
    in_flight = unfinished(topic, days=10)
    retention.set_policy(topic, keep_completed_days=7)
    assert retention.apply() == {"jobs": 4}
    assert left() == pks(*young, old_failed, old_suspended, in_flight)
    del old


def test_failed_days_delete_old_failures_only(topic):
    finished(topic, TaskState.FAILED, days=100)
    kept_failed = finished(topic, TaskState.FAILED, days=80)
    completed = [finished(topic, state, days=100) for state in COMPLETED]
    suspended = finished(topic, TaskState.SUSPENDED, days=100)
    retention.set_policy(topic, keep_failed_days=90)
    assert retention.apply() == {"jobs": 1}
    assert left() == pks(kept_failed, *completed, suspended)


def test_failures_can_be_kept_longer_than_successes(topic):
    finished(topic, TaskState.FAILED, days=40)
    finished(topic, TaskState.SUCCEEDED, days=10)
    failed = finished(topic, TaskState.FAILED, days=10)
    retention.set_policy(topic, keep_completed_days=7, keep_failed_days=30)
    assert retention.apply() == {"jobs": 2}
    assert left() == pks(failed)


def test_days_count_from_now_which_can_be_given(topic):
    tasks = finished(topic, TaskState.SUCCEEDED, days=0, n=3)
    retention.set_policy(topic, keep_completed_days=7)
    assert retention.apply() == {"jobs": 0}
    assert retention.apply(now=timezone.now() + timedelta(days=8)) == {"jobs": 3}
    assert not left()
    del tasks


def test_zero_days_delete_every_finished_task_of_the_class(topic):
    finished(topic, TaskState.FAILED, days=0.001, n=2)
    suspended = finished(topic, TaskState.SUSPENDED, days=1)
    retention.set_policy(topic, keep_failed_days=0)
    assert retention.apply() == {"jobs": 2}
    assert left() == pks(suspended)


def test_completed_rows_keep_the_newest_of_the_four_states_together(topic):
    # Interleaved states, so that the newest 5 mix them: the threshold is over their union.
    tasks = [finished(topic, COMPLETED[i % 4])[0] for i in range(10)]
    failed = finished(topic, TaskState.FAILED, n=3)
    suspended = finished(topic, TaskState.SUSPENDED, n=2)
    in_flight = unfinished(topic, days=0)
    retention.set_policy(topic, keep_completed_rows=5)
    assert retention.apply() == {"jobs": 5}
    assert left() == pks(tasks[5:], failed, suspended, in_flight)
    assert retention.apply() == {"jobs": 0}  # exactly five are left: nothing more to do


def test_failed_rows_keep_the_newest_failures(topic):
    failed = finished(topic, TaskState.FAILED, n=6)
    succeeded = finished(topic, TaskState.SUCCEEDED, n=6)
    retention.set_policy(topic, keep_failed_rows=2)
    assert retention.apply() == {"jobs": 4}
    assert left() == pks(failed[4:], succeeded)


def test_rows_count_by_sequence_not_by_finish_time(topic):
    older = finished(topic, TaskState.SUCCEEDED, days=0)  # finished last, but the lower sequence
    newer = finished(topic, TaskState.SUCCEEDED, days=3)
    retention.set_policy(topic, keep_completed_rows=1)
    assert retention.apply() == {"jobs": 1}
    assert left() == pks(newer)
    del older


def test_fewer_rows_than_the_limit_keep_everything(topic):
    finished(topic, TaskState.SUCCEEDED, n=3)
    finished(topic, TaskState.FAILED, n=1)
    retention.set_policy(topic, keep_completed_rows=3, keep_failed_rows=2)
    assert retention.apply() == {"jobs": 0}
    assert len(left()) == 4


def test_zero_rows_delete_the_whole_class(topic):
    finished(topic, TaskState.SUCCEEDED, n=2)
    finished(topic, TaskState.REDUNDANT, n=2)
    failed = finished(topic, TaskState.FAILED)
    retention.set_policy(topic, keep_completed_rows=0)
    assert retention.apply() == {"jobs": 4}
    assert left() == pks(failed)


def test_days_and_rows_together_delete_what_either_limit_rejects(topic):
    old = finished(topic, TaskState.SUCCEEDED, days=10, n=2)
    recent = finished(topic, TaskState.SUCCEEDED, days=1, n=4)
    retention.set_policy(topic, keep_completed_days=7, keep_completed_rows=3)
    assert retention.apply() == {"jobs": 3}
    assert left() == pks(recent[1:])
    del old


def test_suspended_and_unfinished_tasks_are_never_deleted(topic):
    suspended = finished(topic, TaskState.SUSPENDED, days=400, n=2)
    in_flight = unfinished(topic, days=400)
    retention.set_policy(
        topic, keep_completed_days=0, keep_completed_rows=0, keep_failed_days=0, keep_failed_rows=0
    )
    assert retention.apply() == {"jobs": 0}
    assert left() == pks(suspended, in_flight)


def test_topics_are_independent(topic):
    mine = finished(topic, TaskState.SUCCEEDED, days=10, n=3)
    theirs = finished("other", TaskState.SUCCEEDED, days=10, n=3)
    no_policy = finished("third", TaskState.SUCCEEDED, days=10, n=3)
    retention.set_policy(topic, keep_completed_rows=1)
    retention.set_policy("other", keep_completed_days=30)
    assert retention.apply() == {"jobs": 2, "other": 0}
    assert left() == pks(mine[2:])
    assert left("other") == pks(theirs)
    assert left("third") == pks(no_policy)


def test_apply_to_one_topic(topic):
    finished(topic, TaskState.SUCCEEDED, days=10, n=2)
    theirs = finished("other", TaskState.SUCCEEDED, days=10, n=2)
    retention.set_policy(topic, keep_completed_days=1)
    retention.set_policy("other", keep_completed_days=1)
    assert retention.apply("jobs") == {"jobs": 2}
    assert left("other") == pks(theirs)
    queue.register_topic("bare")
    assert retention.apply("bare") == {}  # no policy: nothing to do


def test_nothing_happens_without_a_policy(topic, django_assert_num_queries):
    finished(topic, TaskState.SUCCEEDED, days=1000, n=3)
    with django_assert_num_queries(1):
        assert retention.apply() == {}
    assert len(left()) == 3


# --- batches ---------------------------------------------------------------------------------


def deletes(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]


def test_batches_are_small_and_a_pass_is_bounded(topic):
    tasks = finished(topic, TaskState.SUCCEEDED, days=10, n=7)
    retention.set_policy(topic, keep_completed_days=1)
    with CaptureQueriesContext(connection) as queries:
        assert retention.apply(batch_size=2, max_batches=2) == {"jobs": 4}
    assert len(deletes(queries)) == 2
    assert left() == pks(tasks[4:])  # the oldest went first
    assert retention.apply(batch_size=2, max_batches=2) == {"jobs": 3}
    assert not left()


def test_every_statement_names_the_topic(topic):
    finished(topic, TaskState.SUCCEEDED, days=10, n=3)
    finished(topic, TaskState.FAILED, n=3)
    retention.set_policy(topic, keep_completed_days=1, keep_failed_rows=1)
    with CaptureQueriesContext(connection) as queries:
        assert retention.apply(batch_size=2) == {"jobs": 5}
    task_table = Task._meta.db_table
    statements = [q["sql"] for q in queries.captured_queries if task_table in q["sql"]]
    assert statements
    for sql in statements:
        assert "topic_id" in sql, sql  # one partition of a table partitioned by topic


def test_the_budget_is_shared_by_the_topics_of_a_pass(topic):
    finished(topic, TaskState.SUCCEEDED, days=10, n=3)
    finished("other", TaskState.SUCCEEDED, days=10, n=3)
    retention.set_policy(topic, keep_completed_rows=0)
    retention.set_policy("other", keep_completed_rows=0)
    assert retention.apply(batch_size=2, max_batches=2) == {"jobs": 3, "other": 0}
    assert retention.apply(batch_size=2, max_batches=2) == {"jobs": 0, "other": 3}


def test_deletions_are_logged_with_structured_fields(topic, caplog):
    finished(topic, TaskState.SUCCEEDED, days=10, n=2)
    retention.set_policy(topic, keep_completed_days=1)
    with caplog.at_level(logging.INFO, logger="django_tasks_coord.retention"):
        retention.apply()
    (record,) = caplog.records
    assert record.getMessage() == "Retention deleted 2 task(s) of topic 'jobs'."
    assert (record.topic, record.deleted) == ("jobs", 2)


# --- row locks -------------------------------------------------------------------------------


def _lock_wait_timeout(seconds: int) -> None:
    """Make the test's connection give up waiting for a row lock after ``seconds``."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SET lock_timeout = '{seconds}s'")
        else:
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {seconds}")


@skip_unless_row_locks()
@pytest.mark.django_db(transaction=True)
def test_a_row_locked_by_another_transaction_is_skipped_not_waited_on():
    queue.register_topic("jobs")
    tasks = finished("jobs", TaskState.SUCCEEDED, days=10, n=4)
    retention.set_policy("jobs", keep_completed_days=1)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        from django.db import connection as own  # this thread's connection

        try:
            with transaction.atomic():
                Task.objects.select_for_update().get(pk=tasks[1].pk)
                held.set()
                release.wait(30)
        finally:
            own.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        _lock_wait_timeout(5)  # were the row waited on, this would fail instead of hanging
        started = time.monotonic()
        assert retention.apply(batch_size=2) == {"jobs": 3}
        assert time.monotonic() - started < 5
        assert left() == {tasks[1].pk}
    finally:
        release.set()
        holder.join(30)
    assert retention.apply() == {"jobs": 1}  # the next pass takes it
    assert not left()


def test_prune_and_retention_share_the_batch_deleter(topic):
    tasks = finished(topic, TaskState.SUSPENDED, days=10, n=3)  # prune deletes every finished state
    deleted = retention.delete_finished(
        "jobs", [TaskState.SUSPENDED], before=timezone.now() - timedelta(days=1), batch_size=2
    )
    assert deleted == 3
    assert not left()
    del tasks


def _ago(days: float) -> datetime:
    return timezone.now() - timedelta(days=days)


def test_a_task_created_after_the_cutoff_waits_until_the_cutoff_passes_its_creation(topic):
    """The scan of a days limit stops at the first task created after the cutoff. A task
    finished before the cutoff but created after it (the app's clock behind the database's)
    is deleted a little later, never earlier."""
    skewed = finished(topic, TaskState.SUCCEEDED, days=10)
    Task.objects.filter(pk=skewed[0].pk).update(created_at=_ago(5))
    recent = finished(topic, TaskState.SUCCEEDED, days=3)
    retention.set_policy(topic, keep_completed_days=7)
    assert retention.apply() == {"jobs": 0}
    assert retention.apply(now=timezone.now() + timedelta(days=2.5)) == {"jobs": 1}
    assert left() == pks(recent)
