"""Calendar event elapses, checked against data generated with systemd-analyze 252.

Every case of ``tests/timers/data`` gives a spec, a zone (systemd's local zone, our
``tz``), a base instant, and the successive elapses systemd computed from it (exact to
the microsecond), then whether systemd found no further elapse (``ENOENT``) or gave up
(``EDEADLK``, its "Infinite loop in calendar calculation" safety valve): in both cases
``next_after`` returns ``None``. Cases marked ``"corrected": "systemd#40260"`` carry
systemd's elapses with that bug (fixed after 252) corrected; ``"uncorrected"`` keeps
systemd 252's own (``tests/timers/data/README.md``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers import CalendarEvent, _calendar_spec
from django_tasks_coord.timers._localtime import Fields
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


_SETTLE = _calendar_spec.settle


def _settle_before_40266(raw: Fields, normalized: Fields) -> tuple[int, Fields]:
    """``settle`` before systemd PR #40266: a change of year reset the month only."""
    if normalized[0] != raw[0]:
        y, _, d, h, mi, s = normalized
        return (0 if normalized[0] > raw[0] else -1), (y, 1, d, h, mi, s)
    return _SETTLE(raw, normalized)


@pytest.fixture
def systemd_before_40266(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our search with systemd#40260 put back (both of its searches use ``settle``)."""
    monkeypatch.setattr(_calendar_spec, "settle", _settle_before_40266)


def _elapses(case: dict[str, Any], count: int) -> list[str]:
    event = CalendarEvent(str(case["spec"]), tz=str(case["zone"]))
    found = event.elapses(instant(str(case["base"])), count)
    return [e.astimezone(UTC).isoformat().replace("+00:00", "Z") for e in found]


CORRECTED = [c for c in cases(valid=True) if c.values[0].get("corrected")]


def test_the_data_corrects_systemd_40260() -> None:
    # The one vector of the original data that carried the bug, and the curated ones.
    assert len(CORRECTED) == 11
    assert {c.values[0]["corrected"] for c in CORRECTED} == {"systemd#40260"}


@pytest.mark.usefixtures("systemd_before_40266")
@pytest.mark.parametrize("case", CORRECTED)
def test_corrected_vectors_differ_from_systemd_252_by_the_bug_only(
    case: dict[str, Any],
) -> None:
    # With the bug put back, our search gives systemd 252's own elapses exactly.
    uncorrected = case["uncorrected"]
    assert _elapses(case, len(uncorrected)) == uncorrected
    assert uncorrected != case["elapses"]


@pytest.mark.usefixtures("systemd_before_40266")
def test_the_bug_changes_no_other_vector() -> None:
    # The generator's criterion missed nothing: every vector it left alone is the same
    # with and without the fix.
    changed = [
        (case["spec"], case["zone"], case["base"])
        for param in cases(valid=True)
        if not (case := param.values[0]).get("corrected")
        and _elapses(case, len(case["elapses"])) != case["elapses"]
    ]
    assert changed == []


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


class TestDayRepetitionsAcrossNewYear:
    """systemd#40260, fixed by systemd PR #40266 (merged after v259): we follow the fix.

    When a day repetition runs past the end of December (day 34 of December is January 3),
    systemd before the fix continued from that normalized day and so skipped the
    days of January before it, 1 January included. The fix restarts the new year on
    1 January, exactly as a search started there would.
    """

    def days(self, spec: str, after: datetime, count: int, tz: str = "UTC") -> list[str]:
        event = CalendarEvent(spec, tz=tz)
        return [e.strftime("%Y-%m-%d %H:%M") for e in event.elapses(after, count)]

    def test_the_reported_case_fires_on_1_january(self) -> None:
        # The issue: '*-*-1/11 23:00:00' from 2025-11-01, Europe/Berlin.
        assert self.days(
            "*-*-1/11 23:00:00", datetime(2025, 11, 1, tzinfo=UTC), 7, tz="Europe/Berlin"
        ) == [
            "2025-11-01 23:00", "2025-11-12 23:00", "2025-11-23 23:00", "2025-12-01 23:00",
            "2025-12-12 23:00", "2025-12-23 23:00", "2026-01-01 23:00",
        ]  # fmt: skip

    def test_weekly_days_into_a_leap_year(self) -> None:
        # Days 1, 8, 15, 22, 29: 29 December runs on to "36 December", 5 January.
        assert self.days("*-*-1/7 09:00", datetime(2027, 12, 28, tzinfo=UTC), 4) == [
            "2027-12-29 09:00", "2028-01-01 09:00", "2028-01-08 09:00", "2028-01-15 09:00",
        ]  # fmt: skip

    def test_a_month_repetition_with_a_day_repetition(self) -> None:
        # Months 1 and 12, days 1, 10, 19, 28 (37 December is 6 January).
        assert self.days("*-1/11-1/9", datetime(2025, 12, 20, tzinfo=UTC), 3) == [
            "2025-12-28 00:00", "2026-01-01 00:00", "2026-01-10 00:00",
        ]  # fmt: skip

    def test_a_weekday_that_falls_on_1_january(self) -> None:
        # 1 January 2026 is a Thursday.
        assert self.days("Thu *-*-1/7", datetime(2025, 12, 1, tzinfo=UTC), 2) == [
            "2026-01-01 00:00", "2026-01-08 00:00",
        ]  # fmt: skip

    def test_from_the_end_of_the_month(self) -> None:
        # '~25/20' is days 7 and 27 of a 31-day month; 47 December is 16 January.
        assert self.days("*-*~25/20", datetime(2025, 12, 20, tzinfo=UTC), 3) == [
            "2025-12-27 00:00", "2026-01-07 00:00", "2026-01-27 00:00",
        ]  # fmt: skip
