"""Flow limits on executor definitions' topics: the executor API's hand-outs (``poll``, the
batch claim) are claims of limited topics, so a topic's rate and concurrency hold for them,
beside the definition's own concurrency limit (the rate window moved by back-dating the
start log, never by sleeping; but the long-poll's, which waits for the window of 1 s)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.core import checks
from django.test import Client, override_settings

from django_tasks_coord import db, definitions, executions, flow, topics
from django_tasks_coord.api import longpoll
from django_tasks_coord.enums import IN_FLIGHT
from django_tasks_coord.exceptions import InvalidArgumentError, LimitKeyConflictError
from django_tasks_coord.models import FlowStart, Task, Topic
from django_tasks_coord.store import flow as flow_claims
from django_tasks_coord.store import handout
from tests.api.conftest import Api, make_user
from tests.flow.conftest import age_starts, fresh_limits  # noqa: F401 (autouse here too)


def in_flight(name: str) -> Counter[str]:
    rows = Task.objects.filter(topic_id=name, state__in=IN_FLIGHT)
    return Counter(rows.values_list("concurrency_key", flat=True))


def create(name: str, n: int, params=None) -> None:
    for _ in range(n):
        executions.create(name, params)


@pytest.mark.django_db
def test_a_rate_limit_on_a_definitions_topic_holds_for_polls():
    definitions.define("flow/rated")
    create("flow/rated", 5)
    flow.set_limits("flow/rated", rate="2/m")
    assert len(executions.poll(["flow/rated"], 5)) == 2
    assert executions.poll(["flow/rated"], 5) == []  # whatever ends: starts, not tasks in flight
    assert sum(FlowStart.objects.filter(topic="flow/rated").values_list("count", flat=True)) == 2
    assert flow_claims.held_back_until(["flow/rated"]) is not None  # the long-poll's next look
    age_starts("flow/rated", 30)
    assert executions.poll(["flow/rated"], 5) == []  # still within the minute
    age_starts("flow/rated", 31)
    assert len(executions.poll(["flow/rated"], 5, start=True)) == 2
    assert flow_claims.held_back_until(["flow/rated"]) is None


@pytest.mark.django_db
def test_a_topic_concurrency_and_a_definition_limit_per_key_both_hold():
    definitions.define(
        "flow/per-key", concurrency_limit=2, concurrency_key_path=["params", "resourceType"]
    )
    for kind in ("disk", "cpu", "net"):
        create("flow/per-key", 3, {"resourceType": kind})
    flow.set_limits("flow/per-key", concurrency=5)  # topic-wide, stricter than 3 keys x 2
    assert len(executions.poll(["flow/per-key"], 10)) == 5
    assert sum(in_flight("flow/per-key").values()) == 5
    assert max(in_flight("flow/per-key").values()) == 2  # the definition's limit per key
    assert executions.poll(["flow/per-key"], 10) == []
    flow.set_limits("flow/per-key")  # no topic limit: the definition's alone
    assert len(executions.poll(["flow/per-key"], 10)) == 1
    assert in_flight("flow/per-key") == {"disk": 2, "cpu": 2, "net": 2}


@pytest.mark.django_db
@pytest.mark.parametrize(("topic_limit", "handed"), [(2, 2), (10, 3)])
def test_the_stricter_of_a_topic_and_a_definition_concurrency_wins(topic_limit, handed):
    definitions.define("flow/limited", concurrency_limit=3)
    create("flow/limited", 6)
    flow.set_limits("flow/limited", concurrency=topic_limit)
    assert len(executions.poll(["flow/limited"], 10)) == handed
    assert executions.poll(["flow/limited"], 10) == []


@pytest.mark.django_db
def test_a_topic_concurrency_holds_for_a_definition_without_a_limit_and_frees_slots(
    monkeypatch,
):
    definitions.define("flow/plain")
    create("flow/plain", 3)
    flow.set_limits("flow/plain", concurrency=1)
    [task] = executions.poll(["flow/plain"], 3)
    assert executions.poll(["flow/plain"], 3) == []
    woken: list[str] = []
    monkeypatch.setattr(db, "notify", lambda conn, topic: woken.append(topic))
    handout.freed_a_slot(task)  # long-polls waiting for the slot wake up
    assert woken == ["flow/plain"]


@pytest.mark.django_db
@pytest.mark.parametrize("start", [False, True])
def test_a_limit_set_after_the_cache_was_filled_is_not_bypassed(start):
    definitions.define("flow/fast")
    create("flow/fast", 4)
    assert len(executions.poll(["flow/fast"], 1, start=start)) == 1  # unlimited: the fast path
    Topic.objects.filter(name="flow/fast").update(rate_limit="1/h")  # as another process does
    assert not flow.limits_of("flow/fast").limited  # this process does not know yet
    assert executions.poll(["flow/fast"], 4, start=start) == []  # the statement's guard
    flow._cache.clear()
    topics.known_topics.clear()
    assert len(executions.poll(["flow/fast"], 4, start=start)) == 1
    assert executions.poll(["flow/fast"], 4, start=start) == []


@pytest.mark.django_db
def test_a_definitions_topic_takes_no_key():
    definitions.define(
        "flow/keyed", concurrency_limit=2, concurrency_key_path=["params", "resourceType"]
    )
    with pytest.raises(InvalidArgumentError, match="executor definition"):
        flow.set_limits("flow/keyed", concurrency=1, key="identifier")
    with pytest.raises(InvalidArgumentError, match="executor definition"):
        flow.set_limits("flow/keyed", rate="5/s", key="payload.resourceType", fair=True)
    assert flow.set_limits("flow/keyed", rate="5/s", concurrency=4).concurrency == 4
    flow.set_limits("jobs", concurrency=1, key="identifier")  # other topics still do
    declared = {"flow/keyed": {"concurrency": 1, "key": "identifier"}}
    with pytest.raises(InvalidArgumentError, match="executor definition"):
        flow.apply_settings(declared)  # as runscheduler does when it starts
    with override_settings(TASKS_COORD={"LIMITS": declared}):
        errors = [e for e in checks.run_checks() if e.id == "tasks_coord.E003"]
    assert errors and "executor definition" in errors[0].msg


@pytest.mark.django_db
def test_a_definitions_topic_takes_no_limits_of_key_values():
    definitions.define(
        "flow/valued", concurrency_limit=2, concurrency_key_path=["params", "resourceType"]
    )
    with pytest.raises(InvalidArgumentError, match="executor definition"):
        flow.set_limits("flow/valued", concurrency=4, key_limits={"disk": {"concurrency": 1}})
    with pytest.raises(InvalidArgumentError, match="executor definition"):
        flow.set_key_limits("flow/valued", "disk", concurrency=1)
    with pytest.raises(LimitKeyConflictError, match="executor definition"):
        flow.ensure_key("flow/valued", "payload.task")  # @task limits on a queue named so
    assert Topic.objects.filter(name="flow/valued", key_limits__isnull=False).count() == 0
    limits = flow.set_limits("flow/valued", total_rate="10/s", total_concurrency=3)
    assert (str(limits.total_rate), limits.total_concurrency) == ("10/s", 3)
    declared = {"flow/valued": {"key_limits": {"disk": {"rate": "1/s"}}}}
    with override_settings(TASKS_COORD={"LIMITS": declared}):
        errors = [e for e in checks.run_checks() if e.id == "tasks_coord.E003"]
    assert errors and "executor definition" in errors[0].msg


@pytest.mark.django_db
def test_a_topic_total_concurrency_holds_for_hand_outs():
    definitions.define(
        "flow/total", concurrency_limit=2, concurrency_key_path=["params", "resourceType"]
    )
    for kind in ("disk", "cpu", "net"):
        create("flow/total", 3, {"resourceType": kind})
    flow.set_limits("flow/total", concurrency=5, total_concurrency=4)  # the tighter binds
    assert len(executions.poll(["flow/total"], 10)) == 4
    assert max(in_flight("flow/total").values()) == 2  # the definition's limit per key
    assert executions.poll(["flow/total"], 10) == []
    flow.set_limits("flow/total", total_concurrency=5)  # a total alone holds too
    assert len(executions.poll(["flow/total"], 10)) == 1
    assert executions.poll(["flow/total"], 10) == []


@pytest.mark.django_db
def test_a_topic_total_rate_holds_for_hand_outs_beside_its_rate():
    definitions.define("flow/total-rate")
    create("flow/total-rate", 8)
    flow.set_limits("flow/total-rate", rate="3/m", total_rate="4/h")
    assert len(executions.poll(["flow/total-rate"], 8)) == 3  # the rate per minute
    assert executions.poll(["flow/total-rate"], 8) == []
    assert flow_claims.held_back_until(["flow/total-rate"]) is not None
    age_starts("flow/total-rate", 61)
    assert len(executions.poll(["flow/total-rate"], 8, start=True)) == 1  # 4 in the hour
    assert executions.poll(["flow/total-rate"], 8) == []
    age_starts("flow/total-rate", 3600)
    assert len(executions.poll(["flow/total-rate"], 8)) == 3


@pytest.mark.django_db
def test_a_total_limit_set_after_the_cache_was_filled_is_not_bypassed():
    definitions.define("flow/fast-total")
    create("flow/fast-total", 4)
    assert len(executions.poll(["flow/fast-total"], 1)) == 1  # unlimited: the fast path
    Topic.objects.filter(name="flow/fast-total").update(total_concurrency_limit=2)
    assert executions.poll(["flow/fast-total"], 4) == []  # the statement's guard
    flow._cache.clear()
    topics.known_topics.clear()
    assert len(executions.poll(["flow/fast-total"], 4)) == 1
    assert executions.poll(["flow/fast-total"], 4) == []


@pytest.mark.django_db
def test_a_freed_slot_of_a_topic_total_concurrency_wakes_long_polls(monkeypatch):
    definitions.define("flow/total-slot")
    create("flow/total-slot", 2)
    flow.set_limits("flow/total-slot", total_concurrency=1)
    [task] = executions.poll(["flow/total-slot"], 2)
    woken: list[str] = []
    monkeypatch.setattr(db, "notify", lambda conn, topic: woken.append(topic))
    handout.freed_a_slot(task)
    assert woken == ["flow/total-slot"]


@pytest.mark.django_db(transaction=True)
def test_a_rate_limit_on_a_definitions_topic_holds_for_the_batch_claim():
    api = Api(make_user("executor", "execute_tasks")[1], Client())
    create("test/basic", 5)
    flow.set_limits("test/basic", rate="3/m")
    body = {"definitions": ["test/basic"], "limit": 5}
    assert len(api.ok("POST", "claim", body)["tasks"]) == 3
    assert api.ok("POST", "claim", body)["tasks"] == []
    age_starts("test/basic", 61)
    assert len(api.ok("POST", "claim", body)["tasks"]) == 2
    assert len(api.ok("POST", "poll", body)["tasks"]) == 0  # nothing left


@pytest.mark.django_db(transaction=True)
@override_settings(TASKS_COORD={"LONG_POLL_INTERVAL": 30})
def test_a_long_poll_held_back_by_a_rate_looks_again_when_the_window_moves_on():
    # Neither a NOTIFY (none is sent) nor the interval (30 s; 10 s with LISTEN) wakes it.
    assert seconds_of_the_second_long_poll_at_1_per_s() < 5


def seconds_of_the_second_long_poll_at_1_per_s() -> float:
    """Two tasks, a rate of 1/s, two long-polls of limit 2 and timeout 20 s, each handed one
    task: how long the second one took."""
    api = Api(make_user("executor", "execute_tasks")[1], Client())
    create("test/basic", 2)
    flow.set_limits("test/basic", rate="1/s")
    body = {"definitions": ["test/basic"], "limit": 2, "timeout": 20}
    assert len(api.ok("POST", "long-poll", body)["tasks"]) == 1
    began = time.monotonic()
    assert len(api.ok("POST", "long-poll", body)["tasks"]) == 1
    return time.monotonic() - began


@pytest.mark.django_db(transaction=True)
@override_settings(TASKS_COORD={"LONG_POLL_INTERVAL": 30})
def test_a_long_poll_looks_again_when_the_moment_its_check_noted_passed_before_it_read_it(
    monkeypatch,
):
    # A claim's retry_after can be shorter than its round trip: the window has moved on
    # when the long-poll reads it. Here every held-back hand-out notes the moment 1 ms
    # after it began, past by then (MariaDB, once: 20 s, the long-poll's timeout).
    note = flow_claims._note_held_back
    monkeypatch.setattr(
        flow_claims,
        "_note_held_back",
        lambda topic, seconds, since: note(topic, None if seconds is None else 0.001, since),
    )
    # It looked again, not after its timeout (20 s).
    assert seconds_of_the_second_long_poll_at_1_per_s() < 5


@pytest.mark.django_db(transaction=True)
@override_settings(TASKS_COORD={"LONG_POLL_INTERVAL": 30})
def test_an_old_held_back_entry_does_not_make_a_long_poll_look_again_and_again(monkeypatch):
    create("test/basic", 2)
    flow.set_limits("test/basic", rate="1/h")
    assert len(executions.poll(["test/basic"], 2)) == 1
    assert executions.poll(["test/basic"], 2) == []  # held back: noted
    flow.set_limits("test/basic")  # unlimited since: its hand-outs leave the entry as it is
    assert len(executions.poll(["test/basic"], 2)) == 1  # nothing is left
    assert flow_claims.held_back_until(["test/basic"]) is not None  # the entry is kept
    flow_claims._held_back["test/basic"] -= 7200  # as if noted two hours ago: long past
    checks: list[float] = []
    check = longpoll._check
    monkeypatch.setattr(
        longpoll, "_check", lambda *a, **kw: checks.append(time.monotonic()) or check(*a, **kw)
    )
    api = Api(make_user("executor", "execute_tasks")[1], Client())
    body = {"definitions": ["test/basic"], "limit": 1, "timeout": 1}
    assert api.ok("POST", "long-poll", body)["tasks"] == []
    # Its first attempt, a check, and one after its timeout: not one every 20 ms.
    assert len(checks) <= 4, f"{len(checks)} checks"
