"""The work watch: where nothing announces work, a waiting node looks for it every
``WATCH_INTERVAL`` (times the live nodes) with one statement, and claims when it sees some.

The dispatcher ticks in this thread against the fake clock and events of
``tests/node/test_idle.py``; the look itself is tested against the database, and one
node process shows that a task pushed by another process starts without any poll.
"""

from __future__ import annotations

import itertools
import threading
from types import SimpleNamespace

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_tasks_coord import queue, topics
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import ConfigurationError
from django_tasks_coord.models import Task
from django_tasks_coord.node import Node
from django_tasks_coord.node.duty import run_loop
from django_tasks_coord.node.watch import WorkWatch
from tests.conftest import skip_unless_row_locks
from tests.node.test_idle import FakeClock, FakeEvent, idle_node
from tests.processes import reap, runscheduler, wait_for


def tick_for(node: Node, clock: FakeClock, seconds: float, looks=()) -> tuple[list, list]:
    """Tick ``node``'s dispatcher for ``seconds`` of fake time; ``looks``: what each look of
    the watch returns (then False); claim rounds claim nothing. Returns the times (seconds
    from the start) of the looks and of the claim rounds."""
    start = clock.monotonic()
    looked: list[float] = []
    rounds: list[float] = []
    script = iter(looks)

    def look(topics):
        looked.append(round(clock.monotonic() - start, 3))
        return next(script, False)

    def claim_round():
        rounds.append(round(clock.monotonic() - start, 3))
        return 0

    dispatcher = node.dispatcher
    dispatcher.watch.look = look  # type: ignore[method-assign]
    dispatcher.refresh_topics = lambda: None  # type: ignore[method-assign]
    dispatcher.claim_round = claim_round  # type: ignore[method-assign]

    def on_wait(n: int) -> None:
        if clock.monotonic() - start >= seconds:
            node.state.stopping.set()

    dispatcher.wake = FakeEvent(clock, on_wait)  # type: ignore[assignment]
    run_loop(dispatcher, node.state.stopping)
    return looked, rounds


def watched(seconds: float, looks=(), *, live: int = 1, **settings) -> tuple[list, list]:
    """:func:`tick_for` on a new idle node where nothing announces work."""
    clock = FakeClock()
    node = idle_node(clock=clock, **settings)
    node.state.live_nodes = live
    return tick_for(node, clock, seconds, looks)


def test_a_waiting_node_looks_every_watch_interval_and_polls_up_to_the_notified_cap():
    looked, rounds = watched(
        70, watch_interval=0.5, max_poll_interval=5.0, notified_poll_interval=30.0
    )
    # Full rounds back off as on PostgreSQL with NOTIFY, up to NOTIFIED_POLL_INTERVAL...
    assert rounds == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 61.0]
    # ...and in between the node looks every WATCH_INTERVAL, and before each round.
    assert [t for t in looked if 31.0 < t < 61.0] == [31.0 + 0.5 * i for i in range(1, 60)]
    assert 61.0 in looked  # the round's own look: what it saw first


def test_a_look_that_sees_work_claims_at_once():
    looked, rounds = watched(3, [False, False, False, True], watch_interval=0.5)
    assert looked[:4] == [0.5, 1.0, 1.5, 2.0]  # the round at 1.0 looked first, too
    assert rounds[:3] == [0.0, 1.0, 2.0]  # the round at 2.0: the look saw work


def test_of_n_live_nodes_each_looks_n_times_less_often():
    looked, _ = watched(40, live=8, watch_interval=0.25)
    gaps = [b - a for a, b in itertools.pairwise(looked) if a > 20]
    assert len(gaps) > 5 and set(gaps) == {2.0}  # 8 x WATCH_INTERVAL


@pytest.mark.parametrize(("case", "fifth"), [("off", 12.0), ("notify", 15.0)])
def test_no_watch_without_interval_or_where_notify_wakes_the_node(case, fifth):
    clock = FakeClock()
    node = idle_node(
        clock=clock, watch_interval=0.0 if case == "off" else 0.5, max_poll_interval=5.0
    )
    if case == "notify":  # PostgreSQL, its LISTEN connection up
        node.state.listener = SimpleNamespace(listening=threading.Event())  # type: ignore[assignment]
        node.state.listener.listening.set()
    assert not node.dispatcher.watch.active
    looked, rounds = tick_for(node, clock, 20)
    assert looked == []
    assert rounds[:5] == [0.0, 1.0, 3.0, 7.0, fifth]  # capped at MAX_POLL_INTERVAL, or 30 s


def test_a_burst_does_not_watch():
    node = idle_node(watch_interval=0.5)
    object.__setattr__(node.config, "burst", True)  # a burst exits once nothing is due
    assert node.dispatcher.watch_until(3.0) == 3.0
    assert node.dispatcher._poll_at is None


def test_watch_interval_must_be_a_non_negative_number():
    for bad in (-0.1, "0.2", True):
        with pytest.raises(ConfigurationError, match="WATCH_INTERVAL"):
            idle_node(watch_interval=bad)


# --- the look -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_look_is_one_statement_that_sees_pushes_releases_and_resumed_topics():
    queue.register_topic("work")
    queue.register_topic("other")
    watch = WorkWatch(idle_node(watch_interval=0.2).state)
    watch.expect_nothing()  # a claim round found nothing
    with CaptureQueriesContext(connection) as statements:
        assert not watch.look(["work"])
    assert len(statements.captured_queries) == 1
    queue.push("other", "elsewhere")
    assert not watch.look(["work"])  # not its topics
    queue.push("work", "a")
    assert watch.look(["work"])
    assert not watch.look(["work"])  # seen
    (task,) = queue.poll("work")
    assert watch.look(["work"])  # claimed by someone: a change (one round finds nothing)
    queue.release(task)
    assert watch.look(["work"])  # back in the queue
    topics.pause_topic("work")
    assert watch.look(["work"])  # its tasks wait for the resume now, not for a claim
    queue.push("work", "b")
    assert not watch.look(["work"])
    topics.resume_topic("work")
    assert watch.look(["work"])


@skip_unless_row_locks()
@pytest.mark.django_db(transaction=True)
def test_a_task_committed_after_a_later_numbered_one_is_still_seen():
    queue.register_topic("work")
    watch = WorkWatch(idle_node(watch_interval=0.2).state)
    watch.expect_nothing()
    pushed, commit = threading.Event(), threading.Event()

    def push_and_wait() -> None:
        from django.db import connection as own  # this thread's connection

        try:
            with transaction.atomic():
                queue.push("work", "early")  # the lower sequence, committed last
                pushed.set()
                commit.wait(30)
        finally:
            own.close()

    early = threading.Thread(target=push_and_wait)
    early.start()
    try:
        assert pushed.wait(10)
        late = queue.push("work", "late")
        assert watch.look(["work"])  # "late" waits: its sequence is the highest
        commit.set()
        early.join(30)
        assert Task.objects.get(identifier="early").pk < late.pk
        assert watch.look(["work"])  # the same highest sequence, one more task waiting
    finally:
        commit.set()
        early.join(30)


@pytest.mark.django_db(transaction=True)
def test_work_the_look_sees_in_a_topic_resumed_elsewhere_is_claimed_in_the_same_round():
    queue.register_topic("work")
    node = idle_node(watch_interval=0.2)
    owner = queue.register_owner("n1")
    node.owner = owner
    node.state.claims.registered(owner, node.state.claims.now())
    dispatcher = node.dispatcher
    submitted: list = []
    dispatcher.pool = SimpleNamespace(submit=submitted.append)  # type: ignore[assignment]
    topics.pause_topic("work")
    assert dispatcher.tick() is not None  # finds nothing: "work" is paused
    assert dispatcher.topics == [] and dispatcher._poll_at is not None
    queue.push("work", "a")
    topics.resume_topic("work")  # by another process: nothing wakes this node
    dispatcher.wake.clear()
    before_the_poll = dispatcher._poll_at - 1.0  # a look, not the poll: nothing re-read the topics
    node.state.clock = SimpleNamespace(  # type: ignore[assignment]
        monotonic=lambda: before_the_poll, now=node.state.clock.now
    )
    dispatcher.tick()  # the look sees the task, the claim reads the topics again
    assert dispatcher.topics == ["work"]
    assert Task.objects.get(identifier="a").state == TaskState.ACTIVE
    assert len(submitted) == 1


# --- end to end -----------------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.django_db(transaction=True)
def test_a_task_pushed_by_another_process_starts_through_the_watch_alone():
    """Polls every 10 minutes and no NOTIFY: only the watch can find the pushed tasks."""
    queue.register_topic("work")
    settings = {
        "POLL_INTERVAL": 600,
        "MAX_POLL_INTERVAL": 600,
        "NOTIFIED_POLL_INTERVAL": 600,
        "LISTEN_NOTIFY": False,
        "WATCH_INTERVAL": 0.1,
        "STATUS_INTERVAL": 0,
    }
    proc = runscheduler("--topic", "work", settings=settings)
    try:
        for i in range(3):  # each pushed once the node settled after the one before
            task = queue.push("work", f"t{i}")

            def done(pk: int = task.pk) -> bool:
                """the pushed task ran"""
                return Task.objects.get(pk=pk).state == TaskState.SUCCEEDED

            wait_for(done, timeout=30)
    finally:
        reap(proc, 15)
