"""The node's stop event wakes every wait registered with it (no database involved)."""

from __future__ import annotations

import threading

from django_tasks_coord.node.wakeup import StopEvent, WakeEvent


def test_a_stop_sets_every_wake_event_for_good():
    stop = StopEvent()
    wake = WakeEvent(stop)
    wake.set()
    wake.clear()
    assert not wake.wait(0)  # an ordinary event before the stop
    stop.set()
    assert wake.is_set()
    wake.clear()  # a loop clearing its event just after the stop request...
    assert wake.wait(0)  # ...cannot miss it


def test_a_wake_event_made_after_the_stop_is_set():
    stop = StopEvent()
    stop.set()
    assert WakeEvent(stop).wait(0)


def test_a_stop_interrupts_a_waiting_thread():
    stop = StopEvent()
    wake = WakeEvent(stop)
    woken = threading.Event()

    def sleeper():
        wake.wait(60)
        woken.set()

    thread = threading.Thread(target=sleeper)
    thread.start()
    stop.set()
    assert woken.wait(10)
    thread.join(10)


def test_callbacks_run_on_set_and_at_once_when_already_set():
    stop = StopEvent()
    calls = []
    stop.on_set(lambda: calls.append("a"))
    removed = lambda: calls.append("removed")  # noqa: E731
    stop.on_set(removed)
    stop.remove(removed)
    stop.set()
    stop.on_set(lambda: calls.append("b"))
    assert calls == ["a", "b"]
