"""The supervisor's plumbing: wake-ups routed through the subscription table, the duty loop."""

from __future__ import annotations

from types import SimpleNamespace

from django_tasks_coord.coordination import RELEASED
from django_tasks_coord.node.duty import run_loop
from django_tasks_coord.node.subscriptions import Subscriptions
from django_tasks_coord.node.wakeup import StopEvent, WakeEvent
from django_tasks_coord.scheduling.runner import JOBS_TOPIC, SCHEDULE_CHANGED
from django_tasks_coord.topics import RESUMED
from tests.node.test_idle import idle_node


def test_a_payload_goes_to_its_exact_match_else_its_prefix_else_the_rest():
    table = Subscriptions()
    got: list[tuple[str, str | None]] = []
    table.subscribe("exact", lambda p: got.append(("exact", p)))
    table.subscribe_prefix("pre.", lambda p: got.append(("prefix", p)))
    table.subscribe_prefix("pre.", lambda p: got.append(("prefix2", p)))
    table.subscribe_others(lambda p: got.append(("other", p)))
    for payload in ("exact", "pre.x", "work", None):
        table.publish(payload)
    assert got == [
        ("exact", "exact"),
        ("prefix", "pre.x"),
        ("prefix2", "pre.x"),
        ("other", "work"),
        ("other", None),
    ]


def test_the_node_wakes_only_the_duty_a_payload_concerns():
    node = idle_node()  # topics: work
    node.dispatcher.topics = ["work"]
    forgot: list[bool] = []
    node.leadership = SimpleNamespace(forget_lease=lambda: forgot.append(True))  # type: ignore[assignment]
    events = {
        "dispatcher": node.dispatcher.wake,
        "lifeline": node.lifeline.wake,
        "scheduler": node.scheduler_loop.wake,
    }

    def woken(payload: str | None) -> set[str]:
        for event in events.values():
            event.clear()
        node.wake(payload)
        return {name for name, event in events.items() if event.is_set()}

    assert woken(SCHEDULE_CHANGED) == {"scheduler"}
    assert woken(RESUMED + "work") == {"dispatcher"}
    assert woken(RELEASED + "g") == {"lifeline"}
    assert forgot == [True]  # the standby reads the token again at once
    assert woken("work") == {"dispatcher"}
    assert woken(None) == {"dispatcher"}
    assert woken("someone-elses") == set()
    assert woken(JOBS_TOPIC) == set()  # not one of this node's topics


def test_the_loop_sleeps_what_tick_says_skips_a_zero_and_ends_on_none():
    stopping = StopEvent()
    rounds = iter([0.0, 0.25, None])
    slept: list[float] = []

    class Wake(WakeEvent):
        def wait(self, timeout: float | None = None) -> bool:
            slept.append(timeout or 0.0)
            return False

    duty = SimpleNamespace(wake=Wake(stopping), tick=lambda: next(rounds))
    run_loop(duty, stopping)  # type: ignore[arg-type]
    assert slept == [0.25]
