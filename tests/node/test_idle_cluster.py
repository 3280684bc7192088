"""Idle nodes in a cluster: chores at a cluster-wide rate, idle heartbeats, NOTIFY-era polls.

The lifeline ticks in this thread against a fake clock injected into the node and a fake
wake-up event: a wait returns at once and moves the clock to the deadline, so no test
sleeps to let time pass.
"""

from __future__ import annotations

import itertools
import statistics
import threading
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from django_tasks_coord import db, owners, queue, topics
from django_tasks_coord.exceptions import ConfigurationError
from django_tasks_coord.node import Node
from django_tasks_coord.node.duty import run_loop
from tests.node.test_idle import FakeClock, FakeEvent, dispatcher, idle_node, schedule_loop

# --- the idle heartbeat -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heartbeat", "liveness", "idle"), [(1.0, 30.0, 7.5), (1.0, 3.0, 1.0), (0.2, 3.0, 0.75)]
)
def test_an_idle_node_beats_every_quarter_liveness_but_never_faster_than_the_heartbeat(
    heartbeat, liveness, idle
):
    config = idle_node(heartbeat_frequency=heartbeat, liveness_interval=liveness).config
    assert config.idle_heartbeat == idle
    # Whatever the settings allow (LIVENESS_INTERVAL >= 2 x HEARTBEAT_FREQUENCY), an idle
    # beat stays well inside the liveness interval, and so inside tasks_coord_health's
    # default maximum age (LIVENESS_INTERVAL): even one failed beat leaves it alive.
    assert config.idle_heartbeat <= liveness / 2


class LifelineClock:
    """The node's clock, moved only by :class:`LifelineEvent` waits (or by the test)."""

    def __init__(self) -> None:
        self.seconds = 1000.0

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> datetime:
        return datetime(2030, 1, 1, tzinfo=timezone.get_current_timezone()) + timedelta(
            seconds=self.seconds
        )


class LifelineEvent:
    """The lifeline's wake-up event: ``wait`` moves the clock by its timeout and returns at
    once, after ``on_wait(clock_seconds)`` (which may set it, or stop the node)."""

    def __init__(self, clock: LifelineClock, on_wait) -> None:
        self.clock, self.on_wait, self.flag = clock, on_wait, False

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def wait(self, timeout: float) -> bool:
        if not self.flag:
            self.clock.seconds += timeout
        self.on_wait(round(self.clock.seconds - 1000.0, 3))
        return self.flag


def cluster_node(**overrides) -> Node:
    """An idle node on a :class:`LifelineClock`."""
    return idle_node(clock=LifelineClock(), **overrides)


def lifeline(node: Node, monkeypatch, *, until: float, live: int = 1, on_wait=None):
    """Tick the lifeline until ``until`` seconds; return the times of heartbeats and sweeps.
    ``node`` runs on a :class:`LifelineClock` (:func:`cluster_node`)."""
    clock = node.state.clock
    assert isinstance(clock, LifelineClock)
    beats: list[float] = []
    sweeps: list[float] = []

    def beat(owner) -> bool:
        beats.append(round(clock.seconds - 1000.0, 3))
        return True

    def survey(owner, older_than):
        sweeps.append(round(clock.seconds - 1000.0, 3))
        return owners.Survey([], live, 0)

    monkeypatch.setattr(owners, "beat", lambda owner, read: (beat(owner), None))
    monkeypatch.setattr(owners, "survey", survey)
    monkeypatch.setattr("django_tasks_coord.executions.reap", lambda: None)

    def waited(at: float) -> None:
        if on_wait is not None:
            on_wait(at)
        if at > until:
            node.state.stopping.set()

    node.lifeline.wake = LifelineEvent(clock, waited)  # type: ignore[assignment]
    run_loop(node.lifeline, node.state.stopping)
    return beats, sweeps


def test_an_idle_node_alone_beats_every_idle_heartbeat_and_sweeps_every_reap_interval(
    monkeypatch,
):
    node = cluster_node(heartbeat_frequency=1.0, liveness_interval=30.0, reap_interval=5.0)
    beats, sweeps = lifeline(node, monkeypatch, until=30.0)
    assert beats == [7.5, 15.0, 22.5, 30.0]
    assert sweeps == [5.0, 10.0, 15.0, 20.0, 25.0, 30.0]  # alone: every REAP_INTERVAL, as before


def test_a_claim_makes_an_idle_node_beat_at_once_then_every_heartbeat(monkeypatch):
    node = cluster_node(heartbeat_frequency=1.0, liveness_interval=30.0, reap_interval=5.0)

    def on_wait(at: float) -> None:
        if at == 7.5:  # the first idle beat is due; the dispatcher claims right after it
            return
        if at == 10.0 and not node.in_flight:
            node.load.claimed(2)  # what a claim round does: the lifeline is woken

    beats, _ = lifeline(node, monkeypatch, until=13.0, on_wait=on_wait)
    assert beats == [7.5, 10.0, 11.0, 12.0, 13.0]


def test_a_node_whose_tasks_are_done_goes_back_to_idle_beats(monkeypatch):
    node = cluster_node(heartbeat_frequency=1.0, liveness_interval=30.0, reap_interval=100.0)
    node.load.claimed(1)

    def on_wait(at: float) -> None:
        if at == 2.0:
            node.load.left(1)

    beats, _ = lifeline(node, monkeypatch, until=17.0, on_wait=on_wait)
    assert beats == [1.0, 2.0, 9.5, 17.0]  # the beat at 2 s chose the idle rate


def test_a_group_member_always_beats_every_heartbeat(monkeypatch):
    node = cluster_node(heartbeat_frequency=1.0, liveness_interval=30.0, reap_interval=100.0)
    node.leadership = SimpleNamespace(tick=lambda: 1.0)  # type: ignore[assignment]
    beats, _ = lifeline(node, monkeypatch, until=5.0)
    assert beats == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_failed_idle_beat_is_retried_after_a_heartbeat(monkeypatch):
    clock = LifelineClock()
    node = idle_node(
        heartbeat_frequency=1.0, liveness_interval=30.0, reap_interval=100.0, clock=clock
    )
    beats: list[float] = []

    def beat(owner) -> bool:
        beats.append(clock.seconds - 1000.0)
        if len(beats) == 1:
            raise OSError("the database is away")
        return True

    monkeypatch.setattr(owners, "beat", lambda owner, read: (beat(owner), None))
    monkeypatch.setattr(node.lifeline, "sweep", lambda: 1)

    def waited(at: float) -> None:
        if at >= 16.5:
            node.state.stopping.set()

    node.lifeline.wake = LifelineEvent(clock, waited)  # type: ignore[assignment]
    run_loop(node.lifeline, node.state.stopping)
    assert beats == [7.5, 8.5, 16.0]


# --- cluster-wide chores ----------------------------------------------------------------------


def at_wall(node: Node, seconds: float) -> None:
    """Put ``node``'s wall clock at ``seconds`` since the epoch (its slots are aligned on it)."""
    clock = node.state.clock
    clock.seconds = seconds  # type: ignore[attr-defined]


def sweep_times(node: Node, live: int, rank: int, until: float) -> list[float]:
    """When ``node`` of ``rank`` among ``live`` sweeps, from 0 to ``until`` on its wall clock."""
    times, at = [], 0.0
    while at < until:
        at_wall(node, at)
        at += node.lifeline.sweep_wait(live, rank)
        times.append(round(at, 6))
    return times


def test_of_n_live_nodes_each_sweeps_twice_every_n_reap_intervals():
    node = cluster_node(heartbeat_frequency=1.0, liveness_interval=30.0, reap_interval=5.0)
    assert node.lifeline.sweep_wait(1) == 5.0  # alone: exactly REAP_INTERVAL
    at_wall(node, 1002.0)
    assert node.lifeline.sweep_wait(8, 3) == pytest.approx(13.0)  # slot 203 (203 % 8 == 3)
    times = sweep_times(node, live=8, rank=3, until=400.0)
    # Slots k with k % 8 in (3, 4): at 15 s and 20 s of each 40 s.
    assert times[:4] == [15.0, 20.0, 55.0, 60.0]
    assert len(times) == pytest.approx(2 * 400 / 40, abs=2)


def test_a_node_sweeps_at_the_rate_its_last_sweep_counted(monkeypatch):
    node = cluster_node(heartbeat_frequency=1.0, liveness_interval=30.0, reap_interval=5.0)
    _, sweeps = lifeline(node, monkeypatch, until=400.0, live=8)
    assert sweeps[0] == 5.0  # the first one after REAP_INTERVAL, as before
    gaps = [b - a for a, b in itertools.pairwise(sweeps)]
    assert all(gap in (5.0, 35.0) for gap in gaps), gaps  # two slots of every eight
    assert statistics.mean(gaps) == pytest.approx(20.0, rel=0.1)


@pytest.mark.parametrize("live", [2, 3, 8, 100])
def test_the_cluster_sweeps_every_reap_interval_even_without_one_of_its_nodes(live):
    """The longest gap between two sweeps of the cluster is what a dead node's tasks may
    wait beyond the liveness interval: REAP_INTERVAL, even when the dead node was one whose
    turn it was (each slot is swept by two nodes)."""
    nodes = [cluster_node(liveness_interval=30.0, reap_interval=5.0) for _ in range(live)]
    until = 5.0 * live * 3
    times = {rank: sweep_times(node, live, rank, until) for rank, node in enumerate(nodes)}
    for dead in [None, *range(live)]:
        swept = sorted({t for rank, ts in times.items() if rank != dead for t in ts})
        steady = [t for t in swept if 5.0 * live <= t <= until - 5.0 * live]
        assert max(b - a for a, b in itertools.pairwise(steady)) == pytest.approx(5.0), dead
    # Twice per slot in all: each node's share shrinks as the cluster grows.
    assert sum(len(ts) for ts in times.values()) == pytest.approx(2 * until / 5.0, abs=2 * live)


# --- PostgreSQL: the safety-net polls while NOTIFY wakes the node ----------------------------


def listening_node(listening: bool | None, **overrides) -> Node:
    node = idle_node(max_poll_interval=5.0, **overrides)
    if listening is not None:
        node.state.listener = SimpleNamespace(listening=threading.Event())  # type: ignore[assignment]
        if listening:
            node.state.listener.listening.set()
    return node


@pytest.mark.parametrize(
    ("listening", "waits"),
    [
        (True, [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),  # NOTIFY wakes it: up to 30 s
        (None, [1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]),  # nothing announces work: 5 s
        (False, [1.0] * 7),  # PostgreSQL, LISTEN connection down: every POLL_INTERVAL
    ],
)
def test_the_dispatchers_safety_net_backs_off_further_only_while_notify_wakes_it(
    monkeypatch, listening, waits
):
    node = listening_node(listening)
    event = dispatcher(node, [0] * 7, FakeClock(), monkeypatch)
    assert event.waits == waits


def test_the_listener_going_down_brings_the_short_polls_back_at_once(monkeypatch):
    node = listening_node(True)

    def on_wait(n: int) -> None:
        if n == 6:
            node.state.listener.listening.clear()
        if n >= 8:
            node.state.stopping.set()

    clock = FakeClock()
    script = iter([])
    monkeypatch.setattr(node.dispatcher, "refresh_topics", lambda: None)
    monkeypatch.setattr(node.dispatcher, "claim_round", lambda: next(script, 0))
    node.dispatcher.wake = FakeEvent(clock, on_wait)  # type: ignore[assignment]
    run_loop(node.dispatcher, node.state.stopping)
    assert node.dispatcher.wake.waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 1.0, 1.0]


def test_notified_poll_interval_at_most_max_poll_interval_keeps_todays_cap(monkeypatch):
    node = listening_node(True, notified_poll_interval=2.0)
    event = dispatcher(node, [0] * 5, FakeClock(), monkeypatch)
    assert event.waits == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_the_scheduler_backs_off_to_the_notified_cap_too(monkeypatch):
    node = listening_node(True, clock=FakeClock())
    event, submitted = schedule_loop(node, monkeypatch, None, rounds=7)
    assert event.waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert submitted == [0.0]


def test_the_scheduler_still_wakes_exactly_at_the_next_slot(monkeypatch):
    node = listening_node(True, clock=FakeClock())
    event, submitted = schedule_loop(node, monkeypatch, timedelta(seconds=50), rounds=7)
    # 1 + 2 + 4 + 8 + 16 s of back-off, then the 19 s left: it wakes at the slot.
    assert event.waits[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, 19.0]
    assert submitted == [0.0, 50.0]


def test_notified_poll_interval_must_be_a_positive_number():
    for bad in (0, -1.0, "30", True):
        with pytest.raises(ConfigurationError, match="NOTIFIED_POLL_INTERVAL"):
            idle_node(notified_poll_interval=bad)


def test_a_bad_notified_poll_interval_is_a_system_check_error():
    from django_tasks_coord.checks import _setting_problems
    from django_tasks_coord.conf import DEFAULTS

    for bad in (0, -1.0, "30", True):
        problems = _setting_problems({**DEFAULTS, "NOTIFIED_POLL_INTERVAL": bad})
        assert any("NOTIFIED_POLL_INTERVAL" in p for p in problems), bad


# --- resumed topics are announced -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_resumed_topic_is_announced_and_the_node_reads_its_topics_at_once(monkeypatch):
    queue.register_topic("work")
    node = idle_node(poll_interval=1.0)
    queue.pause_topic("work")
    node.dispatcher.refresh_topics()
    assert node.dispatcher.topics == []
    announced: list[str] = []
    monkeypatch.setattr(db, "notify", lambda conn, payload: announced.append(payload))
    assert queue.resume_topic("work") is True
    assert announced == [topics.RESUMED + "work"]
    assert queue.resume_topic("work") is False  # not paused: nothing to announce
    assert announced == [topics.RESUMED + "work"]
    node.dispatcher.refresh_topics()
    assert node.dispatcher.topics == []  # read less than POLL_INTERVAL ago, and nothing told it
    node.wake(announced[0])  # what the NOTIFY (or this process's commit) does
    assert node.dispatcher.wake.is_set()
    node.dispatcher.refresh_topics()
    assert node.dispatcher.topics == ["work"]


@pytest.mark.django_db(transaction=True)
def test_pausing_is_still_honoured_before_each_claim_after_poll_interval():
    queue.register_topic("work")
    clock = LifelineClock()
    node = idle_node(poll_interval=1.0, clock=clock)
    node.dispatcher.refresh_topics()
    assert node.dispatcher.topics == ["work"]
    queue.pause_topic("work")
    clock.seconds += 1.0  # one POLL_INTERVAL later: the next claim round reads the topics first
    node.dispatcher.refresh_topics()
    assert node.dispatcher.topics == []


def test_a_node_declared_dead_during_an_outage_retries_after_a_heartbeat_not_at_once(
    monkeypatch,
):
    """Registering again asks the lifeline for a beat at once (``declared_dead`` sets its
    wake-up); while the database is down, every try failed and asked again: a busy loop,
    about a thousand failures a second through an outage (the fault suite's ``outage``
    scenario), until the back-off overflowed and stopped every node. A failed round now
    waits a heartbeat, whatever wake-up it asked for."""
    from django.db import OperationalError

    node = cluster_node(heartbeat_frequency=1.0, liveness_interval=30.0, reap_interval=5.0)
    tries: list[float] = []

    def rejoin() -> None:  # Node._rejoin with the database down
        node.lifeline.declared_dead()
        tries.append(round(node.state.clock.seconds - 1000.0, 3))
        if len(tries) > 100:
            node.state.stopping.set()  # the busy loop: stop it, the assertion below fails
        raise OperationalError("connection refused")

    node.lifeline.rejoin = rejoin  # type: ignore[method-assign]
    node.state.claims.lose()  # the node counts itself dead: every beat registers again
    lifeline(node, monkeypatch, until=20.0)
    assert tries == [7.5 + n for n in range(13)]  # the first beat, then one try a heartbeat
