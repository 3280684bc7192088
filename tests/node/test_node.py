"""The node in-process (threads, real database, no subprocess): dispatching, retries, policies."""

from __future__ import annotations

import threading
import time

import pytest

from django_tasks_coord import handlers, queue
from django_tasks_coord.enums import ErrorPolicy, Result, TaskState, WaitingPolicy
from django_tasks_coord.models import Owner, Task, Topic
from django_tasks_coord.retry import RetryPolicy
from tests.node.conftest import run
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def states(topic="work"):
    return list(
        Task.objects.filter(topic_id=topic).order_by("sequence").values_list("state", flat=True)
    )


def assert_rest_ran_once_for_a_new_owner(seen: list[tuple[str, int, int]]) -> None:
    """t0 ran at its first attempt, then the node froze: nothing claimed by that first owner
    started after the freeze; t0..t4 then ran once each for the new owner, t0 at its second
    attempt (it was running: at least once), the others at their first (refunded)."""
    first_owner = seen[0][2]
    again = seen[1:]
    assert seen[0][:2] == ("t0", 1)
    assert all(owner != first_owner for _, _, owner in again)
    assert sorted((name, attempt) for name, attempt, _ in again) == [
        ("t0", 2),
        ("t1", 1),
        ("t2", 1),
        ("t3", 1),
        ("t4", 1),
    ]
    assert states() == [TaskState.SUCCEEDED] * 5


def test_burst_leaves_retries_that_are_not_due_yet(make_node, work_topic):
    queue.push("work", "flaky", {"fail_times": 1})  # retried 0.2s later (FAST_RETRY)
    run(make_node())
    task = Task.objects.get()
    assert (task.state, task.attempts) == (TaskState.PENDING, 1)
    assert task.execute_at is not None
    assert "attempt 1 fails on purpose" in task.error


def test_burst_drains_every_due_task_and_exits(make_node, work_topic):
    queue.push_many("work", [(f"t{i}", {}) for i in range(60)])
    node = make_node(workers=4, buffer=4, batch_size=7)
    assert run(node) == 0
    assert states() == [TaskState.SUCCEEDED] * 60
    assert Run.objects.count() == 60
    assert node.stats["processed"] == 60
    assert not Owner.objects.exists()  # unregistered on exit


def test_results_map_to_states(make_node, work_topic):
    for result in ("SUCCESS", "FILTER", "SUSPENSION"):
        queue.push("work", result, {"result": result})
    run(make_node())
    assert dict(Task.objects.values_list("identifier", "state")) == {
        "SUCCESS": TaskState.SUCCEEDED,
        "FILTER": TaskState.FILTERED,
        "SUSPENSION": TaskState.SUSPENDED,
    }


def test_failures_are_retried_then_fail_with_the_error(make_node, work_topic):
    queue.push("work", "flaky", {"fail_times": 2})
    queue.push("work", "hopeless", {"fail_times": 99})
    handlers.register(
        "work",
        handlers.registry.consumers()["work"].func,
        retry=RetryPolicy(max_attempts=3, retry_interval=0, jitter=0),
    )
    node = make_node()
    run(node)
    flaky, hopeless = Task.objects.get(identifier="flaky"), Task.objects.get(identifier="hopeless")
    assert (flaky.state, flaky.attempts) == (TaskState.SUCCEEDED, 3)
    assert (hopeless.state, hopeless.attempts) == (TaskState.FAILED, 3)
    assert "Flaky: attempt 3 fails on purpose" in hopeless.error
    runs = Run.objects.filter(identifier="flaky").order_by("pk")  # in the order they ran
    assert list(runs.values_list("attempt", flat=True)) == [
        1,
        2,
        3,
    ]
    assert node.stats["retried"] == 4


def test_consecutive_failures_count_until_a_success(make_node, work_topic):
    consumer = handlers.registry.consumers()["work"].func
    handlers.register("work", consumer, retry=RetryPolicy(max_attempts=1))
    queue.push_many("work", [("a", {"fail_times": 9}), ("b", {"fail_times": 9})])
    run(make_node(workers=1, buffer=0))
    assert Topic.objects.get(name="work").consecutive_failures == 2
    queue.push("work", "c")
    run(make_node())
    assert Topic.objects.get(name="work").consecutive_failures == 0


def test_a_task_without_handler_fails_clearly_and_the_topic_goes_on(make_node):
    queue.register_topic("orphans")
    queue.push("orphans", "lost")
    queue.push("orphans", "named", handler="tests.testapp.consumers.named")
    queue.push("orphans", "typo", handler="tests.testapp.consumers.nope")
    run(make_node(topics=["orphans"]))
    lost, named, typo = (Task.objects.get(identifier=i) for i in ("lost", "named", "typo"))
    assert lost.state == TaskState.FAILED
    assert "has no consumer" in lost.error
    assert named.state == TaskState.SUCCEEDED
    assert Run.objects.filter(identifier="named").count() == 1
    assert typo.state == TaskState.FAILED
    assert "cannot be imported" in typo.error


def test_batch_consumer_gets_batches(make_node, work_topic):
    seen: list[int] = []

    def batch(tasks):
        seen.append(len(tasks))
        return [Result.FILTER if t.payload.get("skip") else None for t in tasks]

    handlers.register("work", batch, batch=True)
    queue.push_many("work", [(f"t{i}", {"skip": i % 2 == 0}) for i in range(10)])
    run(make_node(batch_size=5, workers=1, buffer=4))
    assert sum(seen) == 10
    assert max(seen) > 1
    assert states().count(TaskState.FILTERED) == 5
    assert states().count(TaskState.SUCCEEDED) == 5


def test_terminating_error_policy_pauses_the_topic(make_node, work_topic):
    def fail(task):
        raise RuntimeError("broken")

    handlers.register(
        "work", fail, retry=RetryPolicy(max_attempts=1), error_policy=ErrorPolicy.TERMINATE
    )
    queue.push_many("work", [(f"t{i}", {}) for i in range(3)])
    run(make_node(workers=1, buffer=0, batch_size=1))
    assert Topic.objects.get(name="work").paused is True
    assert states().count(TaskState.FAILED) == 1  # the paused topic was not processed further
    assert states().count(TaskState.PENDING) == 2


def test_paused_topic_is_not_processed(make_node, work_topic):
    queue.push("work", "a")
    queue.pause_topic("work")
    run(make_node())
    assert states() == [TaskState.PENDING]
    queue.resume_topic("work")
    run(make_node())
    assert states() == [TaskState.SUCCEEDED]


def test_waiting_policy_ignores_tasks_started_too_late(make_node, work_topic):
    from datetime import timedelta

    from django.utils import timezone

    handlers.register(
        "work",
        handlers.registry.consumers()["work"].func,
        waiting_time=60,
        waiting_policy=WaitingPolicy.IGNORE,
    )
    queue.push("work", "late", execute_at=timezone.now() - timedelta(minutes=5))
    queue.push("work", "fine", execute_at=timezone.now() - timedelta(seconds=1))
    queue.push("work", "unscheduled")
    run(make_node())
    late = Task.objects.get(identifier="late")
    assert late.state == TaskState.FILTERED
    assert late.message.startswith("Missed")
    assert not Run.objects.filter(identifier="late").exists()
    assert Task.objects.filter(state=TaskState.SUCCEEDED).count() == 2


def test_attempts_used_up_by_dead_nodes_fail_without_running(make_node, work_topic):
    task = queue.push("work", "crashy")
    Task.objects.filter(pk=task.pk).update(attempts=4)  # four claims by nodes that died (max is 4)
    run(make_node())
    task.refresh_from_db()
    assert task.state == TaskState.FAILED
    assert "Attempts exhausted" in task.message
    assert not Run.objects.exists()


def test_delayed_task_runs_when_due(make_node, work_topic):
    from datetime import timedelta

    from django.utils import timezone

    queue.push("work", "soon", execute_at=timezone.now() + timedelta(milliseconds=300))
    node = make_node(
        burst=False, poll_interval=5
    )  # would sleep 5s if it did not compute the due time
    import threading

    thread = threading.Thread(target=node.run)
    thread.start()
    try:
        deadline = timezone.now() + timedelta(seconds=20)
        while timezone.now() < deadline and not Run.objects.exists():
            thread.join(0.05)
    finally:
        node.request_stop()
        thread.join(30)
    run_ = Run.objects.get()
    task = Task.objects.get()
    lag = (run_.started_at - task.execute_at).total_seconds()
    assert 0 <= lag < 2.5


def test_pausing_a_topic_releases_its_buffered_tasks(make_node, work_topic):
    """Tasks claimed ahead (buffered, not started) of a topic that gets paused are given
    back untouched within one poll interval instead of starting anyway."""
    nodes = []
    seen = []

    def first_pauses(task):
        seen.append(task.identifier)
        if task.identifier == "t0":
            queue.pause_topic("work")  # an operator pauses while t1..t4 wait in the buffer
            deadline = time.monotonic() + 10
            while nodes[0].in_flight > 1 and time.monotonic() < deadline:
                time.sleep(0.01)  # waiting for the node to act, not for time to pass

    handlers.register("work", first_pauses)
    queue.push_many("work", [(f"t{i}", {}) for i in range(5)])
    nodes.append(make_node(workers=1, buffer=10, batch_size=5))
    run(nodes[0])
    assert seen == ["t0"]
    tasks = list(Task.objects.filter(topic_id="work").order_by("sequence"))
    assert [t.state for t in tasks] == [TaskState.SUCCEEDED] + [TaskState.PENDING] * 4
    assert [t.attempts for t in tasks[1:]] == [0] * 4  # the claims' attempts were refunded


def test_a_zombie_starts_no_buffered_task_and_registers_again(make_node, work_topic):
    """A node that went longer than the liveness interval without a successful heartbeat
    (its clock jumps, as after SIGSTOP) starts none of its buffered tasks: it gives them
    back (attempt refunded), registers a new owner and runs them as that fresh node."""
    clock = [1000.0]
    nodes = []
    seen = []

    def first_freezes(task):
        seen.append((task.identifier, task.attempts, task.owner_id))
        if task.identifier == "t0" and task.attempts == 1:
            old = nodes[0].owner.pk
            clock[0] += 6  # frozen past the liveness interval (5 s) while t1..t4 wait
            deadline = time.monotonic() + 10
            while nodes[0].owner.pk == old and time.monotonic() < deadline:
                time.sleep(0.01)  # waiting for the node to act, not for time to pass

    handlers.register("work", first_freezes)
    queue.push_many("work", [(f"t{i}", {}) for i in range(5)])
    nodes.append(make_node(workers=1, buffer=10, batch_size=5))
    nodes[0].state.claims.now = lambda: clock[0]  # the clock its claims are judged by
    assert run(nodes[0]) == 0
    assert_rest_ran_once_for_a_new_owner(seen)
    assert not Owner.objects.exists()


class _WatchedLock:
    """A lock that records when a thread had to wait for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.contended = threading.Event()

    def __enter__(self) -> None:
        if not self.lock.acquire(blocking=False):
            self.contended.set()
            self.lock.acquire()

    def __exit__(self, *exc_info) -> None:
        self.lock.release()


def test_a_claim_in_flight_when_the_node_registers_again_is_given_back_refunded(
    make_node, work_topic, monkeypatch
):
    """The node freezes while a claim is on its way (claimed before the freeze, returned
    after it): the node registers again only once those tasks are on its workers' queue,
    so it gives them back with their attempt refunded, like any other buffered task. Before,
    the old owner's removal returned them with an attempt used and never started."""
    clock = [1000.0]
    node = make_node(workers=1, buffer=10, batch_size=5)
    node.state.claims.now = lambda: clock[0]
    node.state.claims.claiming = watched = _WatchedLock()
    seen = []

    def first_pushes_more(task):
        seen.append((task.identifier, task.attempts, task.owner_id))
        if task.identifier == "t0" and task.attempts == 1:
            old = node.owner.pk
            queue.push_many("work", [(f"t{i}", {}) for i in range(1, 5)])
            deadline = time.monotonic() + 10
            while node.owner.pk == old and time.monotonic() < deadline:
                time.sleep(0.01)  # waiting for the node to act, not for time to pass

    real_poll, frozen = queue.poll, []

    def poll_then_freeze(topic, *args, **kwargs):
        tasks = real_poll(topic, *args, **kwargs)
        if not frozen and any(task.identifier == "t1" for task in tasks):
            frozen.append(True)
            old = node.owner.pk
            clock[0] += 6  # frozen past the liveness interval (5 s) as the claim returns
            node.lifeline.wake.set()
            deadline = time.monotonic() + 10
            while (
                node.owner.pk == old
                and not watched.contended.is_set()
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)  # until it registered again, or waits for this claim
        return tasks

    handlers.register("work", first_pushes_more)
    monkeypatch.setattr(queue, "poll", poll_then_freeze)
    queue.push("work", "t0", {})
    assert run(node) == 0
    assert_rest_ran_once_for_a_new_owner(seen)
