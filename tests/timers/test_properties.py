"""Property tests (hypothesis) for every kind of timer.

For calendar events: ``next_after`` is strictly increasing, every elapse matches the
event, and the normalized form has the same elapses as the original. The last one has
one systemd exception, kept out on purpose: a seconds list containing ``0/1`` prints
as ``*`` and loses its fractional values (``*:*:0/1,5.5`` normalizes to ``*:*:*``, so
the ``.5`` elapses are gone); systemd does the same and we print what it prints.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo

from cronsim import CronSim
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers import CalendarEvent, CronExpression, Interval, parse
from django_tasks_coord.timers._calendar_search import Searcher
from django_tasks_coord.timers._localtime import LocalClock, local_seconds

ZONES = [
    "UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney", "America/Santiago",
    "Pacific/Auckland", "Australia/Lord_Howe", "Asia/Kolkata",
]  # fmt: skip
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# -- a grammar of calendar events ------------------------------------------------------------

DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


@st.composite
def weekdays(draw: st.DrawFn) -> str:
    items = []
    for _ in range(draw(st.integers(1, 3))):
        a = draw(st.integers(0, 6))
        if draw(st.booleans()):
            b = draw(st.integers(a, 6))
            items.append(f"{DAYS[a]}{draw(st.sampled_from(['..', '-']))}{DAYS[b]}")
        else:
            items.append(DAYS[a])
    return ",".join(items)


@st.composite
def component(draw: st.DrawFn, low: int, high: int, seconds: bool = False) -> str:
    def number(value: int) -> str:
        text = f"{value:02d}"
        if seconds and draw(st.booleans()):
            text += "." + draw(st.sampled_from(["5", "25", "125", "000001", "999999"]))
        return text

    start = draw(st.integers(low, high))
    kind = draw(st.sampled_from(["value", "repeat", "range", "range-repeat"]))
    if kind == "value":
        return number(start)
    if kind == "repeat":
        return f"{number(start)}/{draw(st.integers(1, max(1, high - start)))}"
    stop = draw(st.integers(start, high))
    text = f"{number(start)}..{number(stop)}"
    if kind == "range-repeat":
        text += f"/{draw(st.integers(1, max(1, stop - start)))}"
    return text


def chain(low: int, high: int, seconds: bool = False) -> st.SearchStrategy[str]:
    return st.one_of(
        st.just("*"),
        st.lists(component(low, high, seconds), min_size=1, max_size=3).map(",".join),
    )


@st.composite
def calendar_specs(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 20)) == 0:
        return draw(st.sampled_from(["minutely", "hourly", "daily", "weekly", "monthly",
                                     "yearly", "quarterly", "semiannually"]))  # fmt: skip
    parts = []
    if draw(st.booleans()):
        parts.append(draw(weekdays()))
    if draw(st.booleans()):
        eom = draw(st.integers(0, 5)) == 0
        date = f"{draw(chain(1, 12))}{'~' if eom else '-'}{draw(chain(1, 28 if eom else 31))}"
        if draw(st.booleans()):
            date = f"{draw(chain(2020, 2060))}-{date}"
        parts.append(date)
    time = f"{draw(chain(0, 23))}:{draw(chain(0, 59))}"
    if draw(st.booleans()):
        time += f":{draw(chain(0, 59, seconds=True))}"
    parts.append(time)
    return " ".join(parts)


def events() -> st.SearchStrategy[CalendarEvent]:
    def build(spec: str, zone: str) -> CalendarEvent | None:
        try:
            return CalendarEvent(spec, tz=zone)
        except TimerError:
            return None

    return st.builds(build, calendar_specs(), st.sampled_from(ZONES)).filter(
        lambda event: event is not None
    )  # type: ignore[return-value]


bases = st.integers(
    min_value=(datetime(2000, 1, 1, tzinfo=UTC) - EPOCH) // timedelta(microseconds=1),
    max_value=(datetime(2060, 1, 1, tzinfo=UTC) - EPOCH) // timedelta(microseconds=1),
).map(lambda usec: EPOCH + timedelta(microseconds=usec))


def take(
    event: CalendarEvent | CronExpression | Interval, base: datetime, n: int
) -> list[datetime]:
    return list(event.elapses(base, n))


# -- calendar events ---------------------------------------------------------------------------


@SETTINGS
@given(events(), bases)
def test_elapses_are_strictly_increasing_and_match(event: CalendarEvent, base: datetime) -> None:
    previous = base
    for found in take(event, base, 6):
        assert found > previous
        assert found.tzinfo is event.tz
        assert event.matches(found), f"{event!r} does not match {found.isoformat()}"
        previous = found


@SETTINGS
@given(events(), bases)
def test_normalized_form_has_the_same_elapses(event: CalendarEvent, base: datetime) -> None:
    seconds = event.spec.usec
    assume(not ((0, -1, 1_000_000) in seconds and len(seconds) > 1))  # the systemd quirk
    again = CalendarEvent(str(event), tz=event.tz)  # type: ignore[arg-type]
    assert again == event
    assert take(again, base, 5) == take(event, base, 5)
    assert parse(str(event), tz=event.tz) == event  # type: ignore[arg-type]


@SETTINGS
@given(events(), bases, st.integers(-14, 14))
def test_fast_search_equals_systemds_mktime_search(
    event: CalendarEvent, base: datetime, hours: int
) -> None:
    # With a fixed offset nothing is ambiguous: the wall-clock search (fast path) and
    # the search emulating glibc's mktime step by step must agree exactly.
    zone: tzinfo = timezone(timedelta(hours=hours))
    searcher = Searcher(event.spec._replace(utc=False, timezone=None))
    after = (base - EPOCH) // timedelta(microseconds=1)
    fast = searcher.next_usec(after, zone)
    seconds, usec = divmod(after + 1, 1_000_000)
    exact = searcher._search_zoned(LocalClock(zone), seconds, usec)
    assert fast == exact


# -- cron and intervals ------------------------------------------------------------------------

cron_field = {
    "minute": st.sampled_from(["*", "0", "*/5", "15,45", "0-30/10", "59"]),
    "hour": st.sampled_from(["*", "0", "2", "9-17", "*/3", "1,2,3"]),
    "dom": st.sampled_from(["*", "1", "13", "*/2", "28-31", "L"]),
    "month": st.sampled_from(["*", "2", "1-6", "*/4", "MAR,OCT"]),
    "dow": st.sampled_from(["*", "0", "1-5", "SAT,SUN", "5", "MON#1"]),
}


@SETTINGS
@given(
    st.tuples(*cron_field.values()).map(" ".join),
    st.sampled_from(ZONES),
    bases,
)
def test_cron_elapses_increase_and_match(expression: str, zone: str, base: datetime) -> None:
    try:
        cron = CronExpression(expression, tz=zone)
    except TimerError:
        assume(False)
        raise
    previous = base
    for found in take(cron, base, 5):
        assert found > previous
        wall = found.replace(tzinfo=None)
        # The wall time is one cronsim itself produces.
        assert next(CronSim(cron.fields, wall - timedelta(seconds=1))) == wall
        previous = found


@SETTINGS
@given(
    st.integers(1, 10**12).map(lambda usec: timedelta(microseconds=usec)),
    st.one_of(st.none(), bases),
    bases,
)
def test_interval_is_anchored(period: timedelta, anchor: datetime | None, base: datetime) -> None:
    timer = Interval(period, anchor=anchor)
    found = take(timer, base, 4)
    assert found[0] > base
    assert found[0] - period <= base or found[0] == timer.anchor
    assert (found[0] - timer.anchor) % period == timedelta(0)
    assert all(b - a == period for a, b in itertools.pairwise(found))
    assert parse(str(timer)) == timer


def test_local_seconds_is_timegm() -> None:
    moment = datetime(2024, 2, 29, 23, 59, 59, tzinfo=UTC)
    assert local_seconds(2024, 2, 29, 23, 59, 59) == int(moment.timestamp())
    assert local_seconds(2024, 14, 0, 24, 60, 60) == int(
        datetime(2025, 2, 1, 1, 1, tzinfo=UTC).timestamp()
    )


def test_zone_fixture_names_exist() -> None:
    for name in ZONES:
        ZoneInfo(name)
