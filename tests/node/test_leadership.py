"""A leader that cannot heartbeat steps down by itself before a standby may take over (a fake
clock, injected)."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from django_tasks_coord.coordination import Lease
from django_tasks_coord.node import leadership as leadership_module
from django_tasks_coord.node.leadership import Leadership


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


def make(monkeypatch, clock, outcome, lease=None):
    """A Leadership whose token reads return ``lease`` (None: never taken) and whose
    lock attempts return ``outcome()`` (a term, or raise)."""
    changes: list[int | None] = []
    monkeypatch.setattr(leadership_module.coordination, "heartbeat", lambda group, node: True)
    monkeypatch.setattr(leadership_module.coordination, "lease", lambda group, liveness: lease)
    monkeypatch.setattr(
        leadership_module.coordination, "try_acquire", lambda group, node, liveness: outcome()
    )
    lead = Leadership("g", "n1", liveness=3.0, heartbeat=1.0, on_change=changes.append, clock=clock)
    return lead, changes


def test_steps_down_one_heartbeat_before_the_lease_could_be_taken(monkeypatch, clock):
    state = {"fail": False}

    def outcome():
        if state["fail"]:
            raise OperationalError("database unreachable")
        return 7

    lead, changes = make(monkeypatch, clock, outcome)
    lead.beat()
    assert lead.valid_term() == 7
    state["fail"] = True
    for elapsed in (1.0, 1.9):  # beats fail, the lease (3s - 1 heartbeat) still holds
        clock.now = 1000.0 + elapsed
        with pytest.raises(OperationalError):
            lead.beat()
        assert lead.valid_term() == 7
    clock.now = 1000.0 + 2.01  # past liveness - heartbeat: step down, before a standby can (3s)
    assert lead.valid_term() is None
    assert changes == [7, None]


def test_token_busy_counts_as_a_missed_beat(monkeypatch, clock):
    from django_tasks_coord.exceptions import TokenBusyError

    state = {"busy": False}

    def outcome():
        if state["busy"]:
            raise TokenBusyError("locked")
        return 3

    lead, changes = make(monkeypatch, clock, outcome)
    lead.beat()
    state["busy"] = True
    clock.now += 1.5
    lead.beat()  # no exception: just a missed beat
    assert lead.valid_term() == 3
    clock.now += 1.0
    lead.beat()
    assert lead.valid_term() is None
    assert changes == [3, None]


def test_a_standby_stays_a_standby(monkeypatch, clock):
    lead, changes = make(monkeypatch, clock, lambda: None)
    lead.beat()
    assert lead.valid_term() is None
    assert changes == []


def test_a_healthy_holder_keeps_its_term_without_locking_the_token(monkeypatch, clock):
    def outcome():
        raise AssertionError("the token must not be locked")

    lead, changes = make(monkeypatch, clock, outcome, Lease(node_id="n1", term=4, seconds_left=2.9))
    lead.beat()
    assert lead.valid_term() == 4
    assert lead.retry_in is None
    assert changes == [4]


@pytest.mark.parametrize(("left", "retry_in"), [(2.5, None), (0.4, 0.4)])
def test_a_standby_waits_for_the_lease_and_retries_when_it_ends(monkeypatch, clock, left, retry_in):
    """A standby does not lock a live holder's token; when the lease ends before its
    next regular beat, it asks to beat again at that moment (``retry_in``)."""

    def outcome():
        raise AssertionError("the token must not be locked while the lease holds")

    lead, changes = make(
        monkeypatch, clock, outcome, Lease(node_id="n2", term=4, seconds_left=left)
    )
    lead.beat()
    assert lead.valid_term() is None
    assert lead.retry_in == retry_in
    assert changes == []


@pytest.mark.parametrize("holder", ["n2", ""])  # a dead holder, or a released token
def test_a_standby_locks_the_token_once_a_takeover_is_possible(monkeypatch, clock, holder):
    lead, changes = make(
        monkeypatch, clock, lambda: 5, Lease(node_id=holder, term=4, seconds_left=0.0)
    )
    lead.beat()
    assert lead.valid_term() == 5
    assert changes == [5]
