"""Calendar event elapses, checked against data generated with systemd-analyze 252.

Every case of ``tests/timers/data`` gives a spec, a zone (systemd's local zone, our
``tz``), a base instant, and the successive elapses systemd computed from it (exact to
the microsecond), then whether systemd found no further elapse (``ENOENT``) or gave up
(``EDEADLK``, its "Infinite loop in calendar calculation" safety valve): in both cases
``next_after`` returns ``None``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers import CalendarEvent
from tests.timers._data import cases, instant


@pytest.mark.parametrize("case", cases(valid=True))
def test_elapses_match_systemd(case: dict[str, object]) -> None:
    event = CalendarEvent(str(case["spec"]), tz=str(case["zone"]))
    current = instant(str(case["base"]))
    elapses = case["elapses"]
    assert isinstance(elapses, list)
    for expected in elapses:
        found = event.next_after(current)
        assert found is not None, f"after {current.isoformat()}"
        # Compare in UTC: == between zones is always False for a repeated wall time.
        assert found.astimezone(UTC) == instant(expected), f"after {current.isoformat()}"
        assert found.tzinfo is event.tz
        current = found
    if case.get("then"):
        assert event.next_after(current) is None


def test_dst_data_covers_both_hemispheres() -> None:
    zones = {str(case.values[0]["zone"]) for case in cases("calendar_dst.json")}  # type: ignore[index]
    assert {"Europe/Berlin", "America/New_York", "Europe/London"} <= zones
    assert {"Australia/Sydney", "America/Santiago", "Pacific/Auckland"} <= zones


BERLIN = ZoneInfo("Europe/Berlin")


def berlin(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=BERLIN, fold=fold)  # type: ignore[misc]


class TestDaylightSavingTime:
    """The two rules, spelled out (the data above checks them in seven zones)."""

    def test_a_local_time_that_does_not_exist_is_skipped(self) -> None:
        event = CalendarEvent("*-*-* 02:30", tz=BERLIN)
        # 2024-03-31 02:30 does not exist in Berlin (02:00 -> 03:00).
        assert event.next_after(berlin(2024, 3, 30, 12)) == berlin(2024, 4, 1, 2, 30)

    def test_a_repeated_local_time_fires_once(self) -> None:
        event = CalendarEvent("*:0/30", tz=BERLIN)
        # 2024-10-27: 02:00-03:00 happens twice (CEST, then CET).
        found = list(event.elapses(berlin(2024, 10, 27, 1, 50), 5))
        assert [f.astimezone(UTC).strftime("%H:%M") for f in found] == [
            "00:00", "00:30", "02:00", "02:30", "03:00",
        ]  # fmt: skip
        assert found[2].utcoffset() == timedelta(hours=1)  # 03:00 CET
        assert (found[2].hour, found[2].minute) == (3, 0)

    def test_starting_inside_the_repeated_hour_continues_there(self) -> None:
        event = CalendarEvent("*:0/30", tz=BERLIN)
        second_pass = berlin(2024, 10, 27, 2, 10, fold=1)  # 02:10 CET
        found = event.next_after(second_pass)
        assert found is not None
        assert found.astimezone(UTC) == datetime(2024, 10, 27, 1, 30, tzinfo=UTC)  # 02:30 CET


class TestNextAfter:
    def test_strictly_after(self) -> None:
        event = CalendarEvent("daily", tz="UTC")
        midnight = datetime(2024, 5, 1, tzinfo=UTC)
        assert event.next_after(midnight) == midnight + timedelta(days=1)
        assert event.next_after(midnight - timedelta(microseconds=1)) == midnight

    def test_microseconds(self) -> None:
        event = CalendarEvent("*:*:0/0.25", tz="UTC")
        start = datetime(2024, 5, 1, tzinfo=UTC)
        assert [e - start for e in event.elapses(start, 3)] == [
            timedelta(seconds=0.25), timedelta(seconds=0.5), timedelta(seconds=0.75),
        ]  # fmt: skip

    @pytest.mark.parametrize("spec", ["*-02-30", "*-04-31", "2023-02-29", "Mon 2024-01-02"])
    def test_impossible_dates_never_fire(self, spec: str) -> None:
        assert CalendarEvent(spec).next_after(datetime(2024, 1, 1, tzinfo=UTC)) is None

    def test_leap_day(self) -> None:
        event = CalendarEvent("*-02-29 12:00", tz="UTC")
        assert [e.year for e in event.elapses(datetime(2023, 1, 1, tzinfo=UTC), 3)] == [
            2024, 2028, 2032,
        ]  # fmt: skip

    def test_last_day_of_month(self) -> None:
        event = CalendarEvent("*-*~01", tz="UTC")
        days = [e.day for e in event.elapses(datetime(2024, 1, 1, tzinfo=UTC), 4)]
        assert days == [31, 29, 31, 30]

    def test_nothing_after_2199(self) -> None:
        assert CalendarEvent("yearly").next_after(datetime(2199, 6, 1, tzinfo=UTC)) is None
        assert CalendarEvent("daily").next_after(datetime(9999, 1, 1, tzinfo=UTC)) is None

    def test_before_the_epoch_starts_at_the_epoch(self) -> None:
        event = CalendarEvent("daily", tz="UTC")
        assert event.next_after(datetime(1900, 1, 1, tzinfo=UTC)) == datetime(
            1970, 1, 1, tzinfo=UTC
        )

    def test_any_aware_datetime_is_accepted(self) -> None:
        event = CalendarEvent("daily", tz="Asia/Tokyo")
        tokyo = event.next_after(datetime(2024, 1, 1, 12, tzinfo=ZoneInfo("America/Denver")))
        assert tokyo == datetime(2024, 1, 3, tzinfo=ZoneInfo("Asia/Tokyo"))

    def test_naive_datetimes_are_refused(self) -> None:
        with pytest.raises(TimerError, match="naive"):
            CalendarEvent("daily").next_after(datetime(2024, 1, 1))

    def test_matches(self) -> None:
        event = CalendarEvent("Mon..Fri *-*-* 09:00", tz=BERLIN)
        assert event.matches(berlin(2024, 1, 1, 9))
        assert not event.matches(berlin(2024, 1, 6, 9))  # a Saturday
        assert not event.matches(berlin(2024, 1, 1, 9, 0, 1))
