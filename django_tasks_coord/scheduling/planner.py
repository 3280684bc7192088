"""Which slots of a job to submit now: pure functions of the job and ``now``.

No database and no clock here: the scheduler passes ``now`` in, and tests do too.
:func:`timing_of` turns a ``periodic_task`` row (already read) into the
:class:`JobTiming` the other functions take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django_tasks_coord.models import CatchUp, JobKind
from django_tasks_coord.timers import Interval, Timer, parse

if TYPE_CHECKING:
    from django_tasks_coord.models import PeriodicTask

#: At most this many past slots are walked through when a job is far behind; beyond
#: that the job skips ahead (see :func:`plan`).
MAX_SCAN = 10_000
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True)
class JobTiming:
    """The parts of a job that decide its slots."""

    timer: Timer
    max_count: int = -1
    run_count: int = 0
    start_time: datetime | None = None
    end_time: datetime | None = None
    catch_up: CatchUp = CatchUp.ONCE
    catch_up_limit: int = 10
    waiting_time: float = 60.0
    fixed_delay: bool = False

    def within_end(self, slot: datetime | None) -> datetime | None:
        """``slot``, or None if it is past ``end_time``."""
        if slot is None or (self.end_time is not None and slot > self.end_time):
            return None
        return slot

    @property
    def runs_left(self) -> int | None:
        """How many more runs ``max_count`` allows (None: unlimited)."""
        return None if self.max_count < 0 else max(self.max_count - self.run_count, 0)


def timing_of(job: PeriodicTask) -> JobTiming:
    """The planner's view of a job row; ``ValueError`` if its stored timer no longer parses."""
    timer = parse(job.timer, tz=job.tz or None)
    if job.kind == JobKind.RECURRING and isinstance(timer, Interval) and job.start_time:
        timer = Interval(timer.period, anchor=job.start_time, tz=timer.tz)
    return JobTiming(
        timer=timer,
        max_count=job.max_count,
        run_count=job.run_count,
        start_time=job.start_time,
        end_time=job.end_time,
        catch_up=CatchUp(job.catch_up),
        catch_up_limit=job.catch_up_limit,
        waiting_time=job.waiting_time,
        fixed_delay=job.fixed_delay,
    )


@dataclass(frozen=True)
class Plan:
    """What to do with a due job now."""

    #: slots to submit a run for, oldest first
    submit: list[datetime]
    #: how many due slots are dropped (missed and not caught up)
    dropped: int
    #: the next slot to wait for; None when the job is finished or (fixed delay) waits for its run
    nextrun: datetime | None
    #: no slot will ever follow
    finished: bool
    #: the first slot after ``now`` (None: there is none)
    following: datetime | None = None
    #: the due slots that were dropped, at most ``catch_up_limit`` of them (for logs)
    dropped_slots: list[datetime] = field(default_factory=list)


def first_slot(timing: JobTiming, now: datetime) -> datetime | None:
    """The first slot of a new (or rescheduled) job: at or after ``start_time``, else after ``now``."""
    if timing.runs_left == 0:
        return None
    start = timing.start_time
    slot = (
        timing.timer.next_after(start - _TICK)
        if start is not None
        else timing.timer.next_after(now)
    )
    return timing.within_end(slot)


def plan(timing: JobTiming, nextrun: datetime, now: datetime) -> Plan:
    """Decide what to submit for a job whose ``nextrun`` is due (``nextrun <= now``).

    The due slots are ``nextrun`` and the following ones up to ``now`` (and up to
    ``end_time``). The latest of them is *on time* if it is at most ``waiting_time``
    seconds old; every other due slot was *missed* (no node could fire it: all
    were down, or the job was paused). Missed slots follow ``catch_up``:

    - ``ONCE``: if no slot is on time, one run for the latest missed slot;
    - ``SKIP``: none;
    - ``ALL``: one run for each of the latest ``catch_up_limit`` missed slots.

    ``max_count`` caps the runs. A job more than :data:`MAX_SCAN` slots behind skips
    ahead without walking every slot (they all count as missed).
    """
    due: list[datetime] = []
    slot: datetime | None = timing.within_end(nextrun)
    while slot is not None and slot <= now and len(due) < MAX_SCAN:
        due.append(slot)
        slot = timing.within_end(timing.timer.next_after(slot))
    following = (
        slot if slot is None or slot > now else timing.within_end(timing.timer.next_after(now))
    )
    on_time = due[-1] if due and (now - due[-1]).total_seconds() <= timing.waiting_time else None
    missed = due[:-1] if on_time is not None else due
    if timing.catch_up == CatchUp.ALL:
        caught = missed[-timing.catch_up_limit :] if timing.catch_up_limit else []
    elif timing.catch_up == CatchUp.ONCE and on_time is None:
        caught = missed[-1:]
    else:
        caught = []
    submit = caught + ([on_time] if on_time is not None else [])
    left = timing.runs_left
    if left is not None:
        submit = submit[:left]
    dropped = len(due) - len(submit)
    exhausted = left is not None and len(submit) >= left
    finished = exhausted or (following is None and not timing.fixed_delay)
    upcoming: datetime | None
    if timing.fixed_delay and submit and not exhausted:
        upcoming = None  # set when the run ends
        finished = False
    else:
        upcoming = None if finished else following
    kept = set(submit)
    dropped_slots = [s for s in due if s not in kept][-timing.catch_up_limit :]
    return Plan(submit, dropped, upcoming, finished, following, dropped_slots)


def after_run(timing: JobTiming, interval: timedelta, ended: datetime) -> datetime | None:
    """Fixed delay: the slot after a run that ended at ``ended`` (None when the job is over)."""
    if timing.runs_left == 0:
        return None
    return timing.within_end(ended + interval)
