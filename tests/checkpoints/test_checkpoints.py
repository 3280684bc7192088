"""Durable steps inside one task: checkpoints written under the claim, read back by the next
attempt (``running.checkpoint``/``checkpoints``/``step``), composite steps that resume, and
checkpoints deleted with their task."""

from __future__ import annotations

import math
import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_tasks_coord import handlers, owners, queue, retention, revival, running
from django_tasks_coord.composite import CHECKPOINT_PREFIX, Composite, Step
from django_tasks_coord.enums import Decision, Insertion, Result, TaskState
from django_tasks_coord.exceptions import InvalidArgumentError, StaleClaimError
from django_tasks_coord.models import Checkpoint, Task
from django_tasks_coord.retry import RetryPolicy
from tests import store_rule
from tests.node.conftest import run
from tests.operating.test_signals import needs_tasks

pytestmark = pytest.mark.django_db(transaction=True)

RETRY_AT_ONCE = RetryPolicy(max_attempts=3, retry_interval=0, backoff="fixed", jitter=0)


def stored(task: Task) -> dict[str, object]:
    return dict(
        Checkpoint.objects.filter(task_id=task.pk).order_by("id").values_list("name", "value")
    )


def claimed(identifier: str = "x", topic: str = "work") -> Task:
    queue.push(topic, identifier)
    (task,) = queue.poll(topic)
    return task


def hand_out_again(task: Task) -> None:
    """What a node declared dead finds: its task handed to another node (a new claim)."""
    Task.objects.filter(pk=task.pk).update(exec_id=uuid.uuid4())


# --- writing under the claim -----------------------------------------------------------------


def test_a_checkpoint_is_written_under_the_claim_and_read_back(work_topic):
    task = claimed()
    running.checkpoint("first", {"cursor": 6000}, task)
    running.checkpoint("second", (1, 2), task)
    running.checkpoint("first", {"cursor": 6001}, task)  # written again: replaced
    assert running.checkpoints(task) == {"first": {"cursor": 6001}, "second": [1, 2]}
    row = Checkpoint.objects.get(task_id=task.pk, name="first")
    assert (row.attempt, row.exec_id) == (1, task.exec_id)


def test_a_checkpoint_is_one_statement(work_topic):
    task = claimed()
    with CaptureQueriesContext(connection) as queries:
        running.checkpoint("n", 1, task)
    assert len(queries) == 1, [q["sql"] for q in queries.captured_queries]


def test_a_write_after_the_claim_was_lost_is_refused(work_topic):
    task = claimed()
    running.checkpoint("before", 1, task)
    hand_out_again(task)
    with pytest.raises(StaleClaimError, match="no longer ACTIVE under this attempt's claim"):
        running.checkpoint("after", 2, task)
    assert stored(task) == {"before": 1}


def test_a_node_declared_dead_cannot_record_a_step(work_topic):
    """The zombie: its owner row expired (no heartbeat), its task freed and claimed by another
    owner; the zombie's checkpoint is refused, the new claim's is written."""
    zombie = owners.register_owner("zombie")
    queue.push("work", "x")
    (held,) = queue.poll("work", owner=zombie)
    running.checkpoint("1", "by the zombie", held)
    assert [t.pk for t in owners.expire(older_than=timedelta(0))] == [held.pk]
    (again,) = queue.poll("work", owner=owners.register_owner("other"))
    with pytest.raises(StaleClaimError):
        running.checkpoint("2", "by the zombie", held)
    running.checkpoint("2", "by the other", again)
    assert stored(held) == {"1": "by the zombie", "2": "by the other"}


def test_a_completed_task_or_one_without_a_claim_records_nothing(work_topic):
    task = claimed()
    queue.complete(task, Result.SUCCESS)
    with pytest.raises(StaleClaimError):
        running.checkpoint("late", 1, task)
    pending = queue.push("work", "pending")
    with pytest.raises(StaleClaimError, match="carries no claim"):
        running.checkpoint("early", 1, pending)
    assert not Checkpoint.objects.exists()


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("", 1, "non-empty str"),
        (7, 1, "non-empty str"),
        ("x" * 201, 1, "at most 200 characters"),
        ("tasks_coord.mine", 1, "'tasks_coord.' \\(reserved\\): not 'tasks_coord.mine'"),
        ("ok", {1, 2}, "must be JSON"),
        ("ok", math.nan, "must be JSON"),
    ],
)
def test_bad_names_and_values_are_refused_before_any_write(work_topic, name, value, match):
    task = claimed()
    with pytest.raises(InvalidArgumentError, match=match):
        running.checkpoint(name, value, task)
    assert not Checkpoint.objects.exists()


def test_outside_a_handler_the_task_is_needed(work_topic):
    with pytest.raises(InvalidArgumentError, match="needs the task"):
        running.checkpoint("a", 1)
    with pytest.raises(InvalidArgumentError, match="needs the task"):
        running.step("a", int)


# --- steps in a node -------------------------------------------------------------------------


def test_step_resumes_after_a_retry(make_node, work_topic):
    calls, seen = [], []

    def effect(name: str) -> dict[str, str]:
        calls.append(name)
        return {"done": name}

    def handler(task: Task) -> None:
        seen.append((task.attempts, running.checkpoints()))
        for name in ("a", "b", "c"):
            assert running.step(name, effect, name) == {"done": name}
            if name == "b" and task.attempts == 1:
                raise RuntimeError("crash after b")

    handlers.register("work", handler, retry=RETRY_AT_ONCE)
    task = queue.push("work", "job")
    node = make_node()
    run(node)
    assert node.state.runs.checkpoint_writes == 3  # tasks_coord_node_checkpoints_written_total
    task.refresh_from_db()
    assert task.state == TaskState.SUCCEEDED and task.attempts == 2
    assert calls == ["a", "b", "c"]  # a and b once: the retry resumed after b
    assert seen == [(1, {}), (2, {"a": {"done": "a"}, "b": {"done": "b"}})]
    attempts = dict(Checkpoint.objects.filter(task_id=task.pk).values_list("name", "attempt"))
    assert attempts == {"a": 1, "b": 1, "c": 2}


def test_a_step_that_raises_records_nothing_and_runs_again(make_node, work_topic):
    calls = []

    def effect() -> int:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("first call fails")
        return 42

    handlers.register("work", lambda task: running.step("s", effect), retry=RETRY_AT_ONCE)
    task = queue.push("work", "job")
    run(make_node())
    assert calls == [0, 1]
    assert stored(task) == {"s": 42}


def test_a_batch_handler_names_its_task(make_node, work_topic):
    outcomes = {}

    def batch(tasks: list[Task]) -> None:
        try:
            running.step("s", int)
        except InvalidArgumentError as exc:
            outcomes["bare"] = str(exc)
        for task in tasks:
            running.checkpoint("mine", task.identifier, task)
            with running.only([task]):
                outcomes[task.identifier] = running.step("s", str, task.identifier)

    handlers.register("work", batch, batch=True)
    a, b = queue.push("work", "a"), queue.push("work", "b")
    run(make_node(batch_size=10))
    assert "running.only" in outcomes["bare"]
    assert (outcomes["a"], outcomes["b"]) == ("a", "b")
    assert stored(a) == {"mine": "a", "s": "a"} and stored(b) == {"mine": "b", "s": "b"}


@needs_tasks
def test_a_django_task_resumes_through_its_context(transactional_db):
    from tests.backends import tasks
    from tests.backends.test_backend import run_node
    from tests.testapp.models import Run

    result = tasks.durable_steps.enqueue("job", "b")
    run_node("default")
    final = tasks.durable_steps.get_result(result.id)
    assert final.return_value == {
        "done": ["A", "B", "C"],
        "checkpoints": {"a": "A", "b": "B", "c": "C"},
    }
    ran = list(Run.objects.order_by("id").values_list("identifier", "attempt"))
    assert ran == [("job:a", 1), ("job:b", 1), ("job:c", 2)]


@needs_tasks
def test_a_coroutine_task_checkpoints_through_sync_to_async(transactional_db):
    from tests.backends import tasks
    from tests.backends.test_backend import run_node

    result = tasks.async_checkpoint.enqueue({"n": 1})
    run_node("default")
    assert tasks.async_checkpoint.get_result(result.id).return_value == {"value": {"n": 1}}


# --- composite steps resume ------------------------------------------------------------------


@pytest.mark.parametrize("max_parallel", [1, 4])
def test_a_composite_resumes_after_a_retry(make_node, work_topic, max_parallel):
    calls = []

    def step(name: str, outcome=None, fail_first=False):
        def run_step(task: Task, supplement: object):
            calls.append((name, task.attempts))
            if fail_first and task.attempts == 1:
                raise RuntimeError(f"{name} crashes on attempt 1")
            return outcome

        return run_step

    flow = Composite(
        {
            "fetch": Step(step("fetch", Decision(Result.FILTER, "cached", continue_=True))),
            "parse": Step(step("parse"), after="fetch"),
            "thumbs": Step(step("thumbs"), after="fetch"),
            "store": Step(step("store", fail_first=True), after=["parse", "thumbs"]),
        },
        max_parallel=max_parallel,
    )
    handlers.register("work", flow, batch=True, retry=RETRY_AT_ONCE)
    task = queue.push("work", "doc")
    run(make_node())
    task.refresh_from_db()
    assert sorted(calls) == sorted(
        [("fetch", 1), ("parse", 1), ("thumbs", 1), ("store", 1), ("store", 2)]
    )
    # The restored FILTER still counts in the task's decision, with its message.
    assert (task.state, task.message, task.attempts) == (TaskState.FILTERED, "fetch: cached", 2)
    assert set(stored(task)) == {
        CHECKPOINT_PREFIX + n for n in ("fetch", "parse", "thumbs", "store")
    }


def test_a_composite_step_that_failed_runs_again(make_node, work_topic):
    calls = []

    def flaky(task: Task, supplement: object) -> Result:
        calls.append(task.attempts)
        return Result.FAILURE if task.attempts == 1 else Result.SUCCESS

    flow = Composite({"a": lambda task, s: None, "b": Step(flaky, after="a")})
    handlers.register("work", flow, batch=True, retry=RETRY_AT_ONCE)
    task = queue.push("work", "doc")
    run(make_node())
    task.refresh_from_db()
    assert task.state == TaskState.SUCCEEDED
    assert calls == [1, 2]
    assert set(stored(task)) == {CHECKPOINT_PREFIX + "a", CHECKPOINT_PREFIX + "b"}


def test_a_composite_whose_claim_is_lost_fails_the_task_at_that_step(work_topic):
    ran = []
    task = claimed()

    def lose_the_claim(t: Task, supplement: object) -> None:
        ran.append("a")
        # Another node's doing, not this step's (a thread of its own, outside the package).
        other = threading.Thread(target=lambda: (hand_out_again(t), connections.close_all()))
        other.start()
        other.join()

    flow = Composite({"a": lose_the_claim, "b": Step(lambda t, s: ran.append("b"), after="a")})
    decision = flow(task)
    assert ran == ["a"]  # b never ran: a's completion could not be recorded
    assert decision.result == Result.FAILURE
    assert isinstance(decision.exception, StaleClaimError)
    assert not Checkpoint.objects.exists()


def test_unclaimed_tasks_run_every_step_and_record_nothing(work_topic):
    task = queue.push("work", "x")  # not polled: no claim
    flow = Composite({"a": lambda t, s: None})
    with CaptureQueriesContext(connection) as queries:
        assert flow(task) == Decision(Result.SUCCESS)
    assert not queries.captured_queries
    assert not Checkpoint.objects.exists()


# --- retention -------------------------------------------------------------------------------


def test_kept_across_a_reset_gone_with_a_new_task(work_topic):
    task = claimed("x")
    running.checkpoint("a", 1, task)
    queue.complete(task, Result.FAILURE)
    revival.reset(Task.objects.get(pk=task.pk))  # the same task again: it resumes
    (again,) = queue.poll("work")
    assert again.pk == task.pk and running.checkpoints(again) == {"a": 1}
    queue.complete(again, Result.SUCCESS)
    queue.push("work", "x")  # a re-enqueue of the same identifier: a new task
    (new,) = queue.poll("work")
    assert new.pk != task.pk and running.checkpoints(new) == {}


def test_deleted_with_their_task_by_retention_and_purge(work_topic):
    pruned, purged, kept = claimed("pruned"), None, None
    running.checkpoint("a", 1, pruned)
    queue.complete(pruned, Result.SUCCESS)
    purged = claimed("purged")
    running.checkpoint("a", 2, purged)
    queue.complete(purged, Result.FAILURE)
    kept = claimed("kept")
    running.checkpoint("a", 3, kept)  # still running: kept
    retention.set_policy("work", keep_completed_days=0)
    retention.apply("work")
    assert not Task.objects.filter(pk=pruned.pk).exists()
    assert set(Checkpoint.objects.values_list("task_id", flat=True)) == {purged.pk, kept.pk}
    queue.purge("work", kept.pk + 1)
    assert list(Checkpoint.objects.values_list("task_id", flat=True)) == [kept.pk]


def test_deleted_with_their_task_by_an_insertion_in_delete_mode(work_topic):
    old, kept = claimed("x"), claimed("y")
    running.checkpoint("a", 1, old)
    running.checkpoint("a", 2, kept)
    queue.complete(old, Result.FAILURE)
    queue.push("work", "x", insertion=Insertion.DELETE)  # the old task goes, and its checkpoints
    assert not Task.objects.filter(pk=old.pk).exists()
    assert list(Checkpoint.objects.values_list("task_id", flat=True)) == [kept.pk]


# --- the admin -------------------------------------------------------------------------------


def test_the_admin_shows_a_tasks_checkpoints(admin_client, work_topic):
    task = claimed()
    running.checkpoint("email-6000", {"sent": True}, task)
    html = admin_client.get(
        reverse("admin:django_tasks_coord_task_change", args=[task.pk])
    ).content.decode()
    assert "email-6000" in html and "&quot;sent&quot;: true" in html


# --- one writer ------------------------------------------------------------------------------


SNEAKY = """
def sneaky(pk):
    return Checkpoint.objects.filter(task_id=pk).delete()
"""


def test_only_the_checkpoint_store_writes_checkpoints(work_topic):
    task = claimed()
    running.checkpoint("a", 1, task)
    found = {}
    for relative in ("store/prune.py", "store/checkpoints.py"):
        code = compile(SNEAKY, store_rule.PACKAGE + relative, "exec")
        names = {"Checkpoint": Checkpoint}
        exec(code, names)
        with store_rule.capture() as found[relative]:
            names["sneaky"](task.pk)
    assert [v.writer for v in found["store/prune.py"]] == [
        "django_tasks_coord.store.prune:sneaky:3"
    ]
    assert found["store/checkpoints.py"] == []
