"""The planner: which slots of a due job to submit, with an injected ``now`` (no clock, no database)."""

from datetime import UTC, datetime, timedelta

from django_tasks_coord.models import CatchUp
from django_tasks_coord.scheduling.planner import MAX_SCAN, JobTiming, after_run, first_slot, plan
from django_tasks_coord.timers import Interval, parse

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
MINUTELY = Interval(timedelta(minutes=1), anchor=T0)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_an_on_time_slot_is_submitted_and_the_next_one_awaited():
    result = plan(JobTiming(MINUTELY), nextrun=at(5), now=at(5) + timedelta(milliseconds=30))
    assert result.submit == [at(5)]
    assert result.nextrun == at(6)
    assert not result.finished
    assert result.dropped == 0


def test_missed_slots_once_runs_the_latest_missed_slot_once():
    result = plan(JobTiming(MINUTELY, waiting_time=10), nextrun=at(1), now=at(5.5))
    assert result.submit == [at(5)]
    assert result.dropped == 4
    assert result.nextrun == at(6)


def test_an_on_time_slot_covers_the_missed_ones_under_once():
    result = plan(
        JobTiming(MINUTELY, waiting_time=10), nextrun=at(1), now=at(5) + timedelta(seconds=3)
    )
    assert result.submit == [at(5)]
    assert result.dropped == 4


def test_missed_slots_skip_runs_nothing_until_the_next_slot():
    result = plan(
        JobTiming(MINUTELY, waiting_time=10, catch_up=CatchUp.SKIP), nextrun=at(1), now=at(5.5)
    )
    assert result.submit == []
    assert result.dropped == 5
    assert result.nextrun == at(6)


def test_missed_slots_all_runs_each_up_to_the_cap():
    timing = JobTiming(MINUTELY, waiting_time=10, catch_up=CatchUp.ALL, catch_up_limit=3)
    result = plan(timing, nextrun=at(1), now=at(5) + timedelta(seconds=2))
    assert result.submit == [at(2), at(3), at(4), at(5)]  # three missed + the on-time slot
    assert result.dropped == 1


def test_max_count_caps_and_finishes():
    timing = JobTiming(MINUTELY, max_count=3, run_count=2, catch_up=CatchUp.ALL, waiting_time=10)
    result = plan(timing, nextrun=at(1), now=at(3))
    assert result.submit == [at(1)]
    assert result.finished
    assert result.nextrun is None


def test_end_time_is_honoured_exactly():
    timing = JobTiming(MINUTELY, end_time=at(3))
    assert plan(timing, nextrun=at(2), now=at(2)).nextrun == at(3)
    last = plan(timing, nextrun=at(3), now=at(3))
    assert last.submit == [at(3)]
    assert last.finished
    assert plan(timing, nextrun=at(3), now=at(3)).following is None


def test_a_one_time_timer_fires_once():
    one = parse("2026-03-02T09:00:00+00:00")
    result = plan(JobTiming(one, max_count=1), nextrun=T0, now=T0 + timedelta(seconds=1))
    assert result.submit == [T0]
    assert result.finished


def test_fixed_delay_waits_for_the_run_to_end():
    timing = JobTiming(MINUTELY, fixed_delay=True)
    result = plan(timing, nextrun=at(1), now=at(1))
    assert result.submit == [at(1)]
    assert result.nextrun is None
    assert not result.finished
    ended = at(1) + timedelta(seconds=42)
    assert after_run(timing, timedelta(minutes=1), ended) == ended + timedelta(minutes=1)
    assert (
        after_run(JobTiming(MINUTELY, max_count=1, run_count=1), timedelta(minutes=1), ended)
        is None
    )


def test_far_behind_never_walks_unbounded_history():
    every_second = Interval(timedelta(seconds=1), anchor=T0)
    now = T0 + timedelta(days=30)
    result = plan(JobTiming(every_second), nextrun=T0, now=now)
    assert len(result.submit) == 1  # once, for all of it
    assert result.dropped >= MAX_SCAN - 1
    assert result.nextrun == now + timedelta(seconds=1) - timedelta(microseconds=now.microsecond)


def test_first_slot():
    assert first_slot(JobTiming(MINUTELY), now=at(2.5)) == at(3)
    assert first_slot(JobTiming(MINUTELY, start_time=at(10)), now=at(2.5)) == at(10)
    assert first_slot(JobTiming(MINUTELY, start_time=at(10), end_time=at(9.5)), now=at(0)) is None
    assert first_slot(JobTiming(MINUTELY, max_count=2, run_count=2), now=at(0)) is None
    calendar = parse("Mon..Fri 09:00", tz="UTC")  # 2026-03-02 is a Monday
    assert first_slot(JobTiming(calendar), now=T0) == T0 + timedelta(days=1)
