"""What an idle node sends to the database: back-off, the scheduler's sleep, the lease reads.

The duties tick in this thread (:func:`~django_tasks_coord.node.duty.run_loop`) against
fake events and a fake clock injected into the node: a wait returns at once and moves the
clock by its timeout, so no test sleeps to let time pass.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_tasks_coord import coordination, db, flow, queue
from django_tasks_coord.coordination import Lease
from django_tasks_coord.exceptions import ConfigurationError
from django_tasks_coord.node import Node, NodeConfig
from django_tasks_coord.node import leadership as leadership_module
from django_tasks_coord.node.backoff import IdleBackoff
from django_tasks_coord.node.duty import run_loop
from django_tasks_coord.node.leadership import Leadership
from django_tasks_coord.scheduling import scheduler
from django_tasks_coord.store import flow as flow_claims
from tests.processes import wait_for

# --- the back-off itself --------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap_and_work_resets_it():
    backoff = IdleBackoff(1.0, 5.0)
    waits = []
    for _ in range(5):
        waits.append(backoff.wait)
        backoff.idle()
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.wait == 1.0


@pytest.mark.parametrize("cap", [1.0, 0.5])
def test_a_cap_of_the_poll_interval_or_less_turns_the_backoff_off(cap):
    backoff = IdleBackoff(1.0, cap)
    for _ in range(3):
        backoff.idle()
    assert backoff.wait == 1.0


def test_max_poll_interval_must_be_a_positive_number():
    base = dict(
        node_id=None,
        workers=1,
        buffer=0,
        batch_size=1,
        topics=None,
        poll_interval=1.0,
        listen_notify=True,
        shutdown_max_wait=1.0,
        status_interval=0,
        reap_interval=5.0,
        heartbeat_frequency=1.0,
        liveness_interval=30.0,
    )
    NodeConfig(**base, max_poll_interval=0.5).validate()  # below POLL_INTERVAL: no back-off
    for bad in (0, -1.0, "5", True):
        with pytest.raises(ConfigurationError, match="MAX_POLL_INTERVAL"):
            NodeConfig(**base, max_poll_interval=bad).validate()


# --- fakes ----------------------------------------------------------------------------------


class FakeClock:
    """A node's clock (wall and monotonic time) that only moves when a fake event waits."""

    def __init__(self) -> None:
        self.start = self.wall = datetime(2030, 1, 1, tzinfo=timezone.get_current_timezone())

    def now(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        return 1000.0 + (self.wall - self.start).total_seconds()

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)


class FakeEvent:
    """A ``threading.Event`` whose ``wait`` returns at once: it records the timeout, moves
    the clock by it, and runs ``on_wait(n)`` (which may set the event, or stop the node)."""

    def __init__(self, clock: FakeClock, on_wait) -> None:
        self.clock = clock
        self.on_wait = on_wait
        self.flag = False
        self.waits: list[float] = []

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def wait(self, timeout: float) -> bool:
        self.waits.append(round(timeout, 3))
        self.on_wait(len(self.waits))
        if not self.flag:
            self.clock.advance(timeout)
        return self.flag


def idle_node(
    *, poll_interval=1.0, max_poll_interval=8.0, clock=None, watch_interval=0.0, **overrides
) -> Node:
    """A node that is idle; by default without the work watch (``tests/node/test_watch.py``)."""
    config = NodeConfig.from_settings(
        burst=False,
        poll_interval=poll_interval,
        max_poll_interval=max_poll_interval,
        status_interval=0,
        topics=["work"],
        watch_interval=watch_interval,
        **overrides,
    )
    node = Node(config) if clock is None else Node(config, clock=clock)
    node.owner = SimpleNamespace(name="n1", pk=1)  # type: ignore[assignment]
    node.state.claims.registered(node.owner, node.state.claims.now())  # its claims stand
    return node


def registered(node: Node) -> Node:
    """``node`` under an owner row of its own (its claims write it)."""
    node.owner = queue.register_owner("n1")
    node.state.claims.registered(node.owner, node.state.claims.now())
    return node


def stop_after(node: Node, rounds: int):
    def on_wait(n: int) -> None:
        if n >= rounds:
            node.state.stopping.set()

    return on_wait


# --- the dispatcher -------------------------------------------------------------------------


def dispatcher(node: Node, claims: list[int], clock: FakeClock, monkeypatch) -> FakeEvent:
    """Tick the dispatcher with scripted claim rounds (``claims``: tasks claimed per round;
    then none) until the script is used up; return the fake wake-up event."""
    script = iter(claims)
    monkeypatch.setattr(node.dispatcher, "refresh_topics", lambda: None)
    monkeypatch.setattr(node.dispatcher, "claim_round", lambda: next(script, 0))
    event = FakeEvent(clock, lambda n: None)
    event.on_wait = stop_after(node, len([c for c in claims if not c]))
    node.dispatcher.wake = event  # type: ignore[assignment]
    run_loop(node.dispatcher, node.state.stopping)
    return event


def test_an_idle_dispatcher_backs_off_and_a_claim_resets_it(monkeypatch):
    clock = FakeClock()
    node = idle_node()
    event = dispatcher(node, [0, 0, 0, 0, 0, 2, 0, 0], clock, monkeypatch)
    assert event.waits == [1.0, 2.0, 4.0, 8.0, 8.0, 1.0, 2.0]


def test_a_node_with_tasks_in_flight_polls_every_poll_interval(monkeypatch):
    clock = FakeClock()
    node = idle_node()
    node.load.claimed(1)  # running a task: not idle
    event = dispatcher(node, [0, 0, 0, 0], clock, monkeypatch)
    assert event.waits == [1.0, 1.0, 1.0, 1.0]


def test_without_backoff_the_dispatcher_polls_every_poll_interval(monkeypatch):
    clock = FakeClock()
    node = idle_node(max_poll_interval=1.0)
    event = dispatcher(node, [0, 0, 0, 0], clock, monkeypatch)
    assert event.waits == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(("listening", "waits"), [(True, [1.0, 2.0, 4.0]), (False, [1.0] * 3)])
def test_on_postgresql_the_backoff_holds_only_while_notify_can_wake_the_node(
    monkeypatch, listening, waits
):
    """A broken LISTEN connection means nothing would wake the node: it polls as before."""
    clock = FakeClock()
    node = idle_node()
    node.state.listener = SimpleNamespace(listening=threading.Event())  # type: ignore[assignment]
    if listening:
        node.state.listener.listening.set()
    event = dispatcher(node, [0, 0, 0], clock, monkeypatch)
    assert event.waits == waits


@pytest.mark.django_db(transaction=True)
def test_an_idle_dispatcher_still_wakes_for_a_delayed_task(monkeypatch):
    queue.register_topic("work")
    node = idle_node()
    node.dispatcher.topics = ["work"]
    for _ in range(3):
        node.dispatcher.backoff.idle()  # waits 8 s now
    queue.push("work", "later", execute_at=timezone.now() + timedelta(seconds=3))
    assert 2.0 < node.dispatcher.idle_timeout() <= 3.0


@pytest.mark.django_db(transaction=True)
def test_an_old_held_back_entry_does_not_keep_an_idle_dispatcher_polling():
    """A topic a rate held back once and unlimited since keeps its entry (its claims no longer
    note anything): the dispatcher waits its idle wait, not 0 s round after round."""
    queue.register_topic("work")
    flow.set_limits("work", rate="1/h")
    queue.push_many("work", [("a", None), ("b", None)])
    assert len(queue.poll("work", 2)) == 1
    assert queue.poll("work", 2) == []  # held back: noted
    flow.set_limits("work")  # unlimited since
    assert len(queue.poll("work", 2)) == 1  # nothing is left
    flow_claims._held_back["work"] -= 7200  # as if noted two hours ago: long past
    node = registered(idle_node())
    node.dispatcher.refresh_topics()
    assert node.dispatcher.topics == ["work"]
    for _ in range(3):
        assert node.dispatcher.claim_round() == 0
        assert node.dispatcher.idle_timeout() == 1.0  # the idle wait (POLL_INTERVAL)


@pytest.mark.django_db(transaction=True)
def test_a_claim_round_held_back_by_a_rate_looks_again_when_its_window_moves_on(monkeypatch):
    """The dispatcher's own claim noted a moment: it waits until then, at least
    RECHECK_AFTER even if the moment passed before it read it (no round at 0 s)."""
    queue.register_topic("work")
    flow.set_limits("work", rate="1/m")
    queue.push_many("work", [("a", None), ("b", None)])
    node = registered(idle_node(max_poll_interval=600.0, poll_interval=600.0))
    node.dispatcher.refresh_topics()
    node.dispatcher.submit = lambda tasks: None  # type: ignore[method-assign]
    assert node.dispatcher.claim_round() == 1
    assert node.dispatcher.claim_round() == 0  # held back for up to a minute
    assert 50 < node.dispatcher.idle_timeout() <= 60
    note = flow_claims._note_held_back
    monkeypatch.setattr(  # every held-back claim notes a moment 1 ms after it began
        flow_claims,
        "_note_held_back",
        lambda topic, seconds, since: note(topic, seconds and 0.001, since),
    )
    assert node.dispatcher.claim_round() == 0
    noted = flow_claims._held_back["work"]
    wait_for(lambda: time.monotonic() > noted, timeout=5)  # the noted moment has passed
    assert node.dispatcher.idle_timeout() == flow_claims.RECHECK_AFTER


# --- the scheduler --------------------------------------------------------------------------


def schedule_loop(node: Node, monkeypatch, due, *, rounds: int, changes=()):
    """Tick the scheduler loop for ``rounds`` waits with one job due ``due`` after the start
    (None: no job); the schedule changes (NOTIFY) during the waits numbered in ``changes``.
    ``node`` runs on a :class:`FakeClock`. Returns the event and the times (seconds after
    the start) ``submit_due`` ran at."""
    clock = node.state.clock
    assert isinstance(clock, FakeClock)
    submitted: list[float] = []
    start = clock.now()
    pending = {"at": None if due is None else start + due}

    def submit_due(node_name):
        submitted.append((clock.now() - start).total_seconds())
        if pending["at"] is not None and clock.now() >= pending["at"]:
            pending["at"] = None
            return ["run"]
        return []

    monkeypatch.setattr(scheduler, "submit_due", submit_due)
    monkeypatch.setattr(scheduler, "next_due", lambda: pending["at"])
    stop = stop_after(node, rounds)

    def on_wait(n: int) -> None:
        if n in changes:
            event.set()
        stop(n)

    event = FakeEvent(clock, on_wait)
    node.scheduler_loop.wake = event
    run_loop(node.scheduler_loop, node.state.stopping)
    return event, submitted


def test_with_nothing_scheduled_the_scheduler_only_reads_next_due_and_backs_off(monkeypatch):
    node = idle_node(max_poll_interval=5.0, clock=FakeClock())
    event, submitted = schedule_loop(node, monkeypatch, None, rounds=5)
    assert event.waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert submitted == [0.0]  # at start only: the safety-net wakes read next_due alone


def test_the_scheduler_sleeps_until_the_next_slot_and_submits_then(monkeypatch):
    node = idle_node(max_poll_interval=5.0, clock=FakeClock())
    event, submitted = schedule_loop(node, monkeypatch, timedelta(seconds=12.5), rounds=6)
    # 1 + 2 + 4 + 5 s of back-off, then the 0.5 s left: the loop wakes exactly at the slot;
    # the submission resets the back-off.
    assert event.waits == [1.0, 2.0, 4.0, 5.0, 0.5, 1.0]
    assert submitted == [0.0, 12.5]


def test_a_schedule_change_makes_the_scheduler_submit_and_resets_the_backoff(monkeypatch):
    node = idle_node(max_poll_interval=5.0, clock=FakeClock())
    event, submitted = schedule_loop(node, monkeypatch, None, rounds=5, changes=(3,))
    assert event.waits == [1.0, 2.0, 4.0, 1.0, 2.0]
    assert submitted == [0.0, 3.0]  # the change came during the third wait, after 1 + 2 s


# --- warm backup: a standby's lease reads -----------------------------------------------------


class MonotonicClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def standby(monkeypatch, *, notified: bool, lease: Lease):
    clock = MonotonicClock()
    reads: list[float] = []

    def read(group, liveness):
        reads.append(clock.now - 1000.0)
        return lease

    def no_lock(*args):
        raise AssertionError("the token must not be locked while the lease holds")

    monkeypatch.setattr(leadership_module.coordination, "heartbeat", lambda group, node: True)
    monkeypatch.setattr(leadership_module.coordination, "lease", read)
    monkeypatch.setattr(leadership_module.coordination, "try_acquire", no_lock)
    lead = Leadership(
        "g",
        "n1",
        liveness=3.0,
        heartbeat=1.0,
        on_change=lambda t: None,
        notified=lambda: notified,
        clock=clock,
    )
    return lead, clock, reads


def test_a_notified_standby_reads_the_token_only_when_the_lease_may_have_ended(monkeypatch):
    lease = Lease(node_id="n2", term=4, seconds_left=2.5)
    lead, clock, reads = standby(monkeypatch, notified=True, lease=lease)
    retries = []
    for at in (0.0, 1.0, 2.0, 2.5, 3.5):
        clock.now = 1000.0 + at
        lead.beat()
        retries.append(lead.retry_in)
    assert reads == [0.0, 2.5]  # then 2.5 + 2.5 = 5.0 is the next read
    # Beating every second, it asks for a beat right when the lease it read ends.
    assert retries == [None, None, 0.5, None, None]
    assert lead.valid_term() is None


def test_an_announced_release_makes_the_standby_read_the_token_at_once(monkeypatch):
    lease = Lease(node_id="n2", term=4, seconds_left=2.5)
    lead, clock, reads = standby(monkeypatch, notified=True, lease=lease)
    lead.beat()
    clock.now += 0.5
    lead.forget_lease()  # Node.wake on a RELEASED notification
    lead.beat()
    assert reads == [0.0, 0.5]


def test_a_standby_without_notify_reads_the_token_every_beat(monkeypatch):
    lease = Lease(node_id="n2", term=4, seconds_left=2.5)
    lead, clock, reads = standby(monkeypatch, notified=False, lease=lease)
    for at in (0.0, 1.0, 2.0):
        clock.now = 1000.0 + at
        lead.beat()
    assert reads == [0.0, 1.0, 2.0]


def test_the_leader_reads_the_token_every_beat(monkeypatch):
    lead, clock, reads = standby(
        monkeypatch, notified=True, lease=Lease(node_id="n1", term=4, seconds_left=2.9)
    )
    for at in (0.0, 1.0, 2.0):
        clock.now = 1000.0 + at
        lead.beat()
    assert reads == [0.0, 1.0, 2.0]
    assert lead.valid_term() == 4


# --- single statements ----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_lease_is_one_statement():
    coordination.join("g", "a")
    coordination.try_acquire("g", "a", timedelta(seconds=30))
    with CaptureQueriesContext(connection) as queries:
        held = coordination.lease("g", timedelta(seconds=30))
    assert (held.node_id, held.term) == ("a", 1)
    assert 25 < held.seconds_left <= 30
    assert len(queries) == 1


@pytest.mark.django_db(transaction=True)  # no test transaction: no savepoints of its own
def test_submit_due_with_nothing_due_only_looks():
    with CaptureQueriesContext(connection) as queries:
        assert scheduler.submit_due("n1") == []
    statements = [q["sql"].split()[0].upper() for q in queries]
    # SQLite takes its write lock with an UPDATE of nothing first (db.serialize_claims), and
    # Django logs its BEGIN and COMMIT there: no savepoint, no insert, one look.
    assert [s for s in statements if s not in ("UPDATE", "BEGIN", "COMMIT")] == ["SELECT"]


@pytest.mark.django_db
def test_the_status_line_costs_nothing_when_nobody_reads_it(caplog):
    node = idle_node()
    node.dispatcher.topics = ["work"]
    caplog.set_level(logging.WARNING, logger="django_tasks_coord.node")
    with CaptureQueriesContext(connection) as queries:
        node.lifeline.status_line()
    assert len(queries) == 0
    caplog.set_level(logging.INFO, logger="django_tasks_coord.node")
    with CaptureQueriesContext(connection) as queries:
        node.lifeline.status_line()
    assert len(queries) == 1  # the queue depth
    assert "queue_depth=0" in caplog.text


# --- waking this process's nodes where there is no NOTIFY ------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_commit_wakes_the_local_nodes_where_there_is_no_notify():
    woken: list[str] = []
    db.add_local_listener(woken.append)
    try:
        with transaction.atomic():
            db.notify(connection, "work")
            assert woken == []  # not before the commit
        with pytest.raises(RuntimeError), transaction.atomic():
            db.notify(connection, "rolled-back")
            raise RuntimeError
    finally:
        db.remove_local_listener(woken.append)
    db.notify(connection, "after")  # no listener any more
    expected = [] if connection.vendor == "postgresql" else ["work"]  # PostgreSQL: NOTIFY
    assert woken == expected
