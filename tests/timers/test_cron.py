"""Cron expressions: cronsim underneath, our zone and DST handling on top."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers import CalendarEvent, CronExpression, parse
from django_tasks_coord.timers.cron import NICKNAMES
from tests.timers._data import cases, instant

BERLIN = ZoneInfo("Europe/Berlin")


def utc_hours(found: list[datetime]) -> list[str]:
    return [f.astimezone(UTC).strftime("%m-%d %H:%M") for f in found]


class TestParsing:
    @pytest.mark.parametrize(("nickname", "fields"), sorted(NICKNAMES.items()))
    def test_nicknames(self, nickname: str, fields: str) -> None:
        cron = CronExpression(nickname.upper())
        assert str(cron) == nickname
        assert cron.fields == fields
        start = datetime(2024, 1, 1, 0, 30, tzinfo=UTC)
        assert cron.next_after(start) == CronExpression(fields).next_after(start)

    def test_whitespace_is_normalized(self) -> None:
        assert str(CronExpression("  0  9 * *\t1-5 ")) == "0 9 * * 1-5"

    @pytest.mark.parametrize(
        ("expression", "message"),
        [
            ("61 * * * *", "bad minute field '61' (field 1 of 5)"),
            ("0 24 * * *", "bad hour field '24'"),
            ("0 0 32 * *", "bad day-of-month field '32'"),
            ("0 0 * 13 *", "bad month field '13'"),
            ("0 0 * * 8", "bad day-of-week field '8'"),
            ("0 0 30 2 *", "bad day-of-month field '30'"),
            ("0 9 * *", "4 fields, expected 5"),
            ("0 0 9 * * 1-5", "6 fields, expected 5"),
            ("@reboot", "@reboot is not a schedule"),
            ("@fortnightly", "unknown nickname"),
        ],
    )
    def test_errors(self, expression: str, message: str) -> None:
        with pytest.raises(TimerError, match="Invalid cron expression") as raised:
            CronExpression(expression)
        assert message in str(raised.value)
        assert repr(expression) in str(raised.value)

    def test_value_object(self) -> None:
        cron = CronExpression("0 9 * * 1-5", tz="Europe/Berlin")
        assert cron == CronExpression("0  9 * * 1-5", tz=BERLIN)
        assert hash(cron) == hash(CronExpression("0 9 * * 1-5", tz=BERLIN))
        assert cron != CronExpression("0 9 * * 1-5", tz="UTC")
        assert repr(cron) == "CronExpression('0 9 * * 1-5', tz='Europe/Berlin')"
        assert pickle.loads(pickle.dumps(cron)) == cron
        with pytest.raises(AttributeError):
            cron._fields = "* * * * *"  # type: ignore[misc]


class TestDays:
    def test_day_of_month_or_day_of_week_when_both_are_restricted(self) -> None:
        # Debian/Vixie cron: the 13th OR a Friday.
        cron = CronExpression("0 9 13 * 5", tz="UTC")
        days = [d.day for d in cron.elapses(datetime(2024, 9, 1, tzinfo=UTC), 6)]
        assert days == [6, 13, 20, 27, 4, 11]  # Fridays, plus Friday the 13th of Sep

    def test_and_when_one_of_them_starts_with_a_star(self) -> None:
        cron = CronExpression("0 9 */2 * 5", tz="UTC")  # odd days that are Fridays
        found = list(cron.elapses(datetime(2024, 9, 1, tzinfo=UTC), 4))
        assert all(d.weekday() == 4 and d.day % 2 == 1 for d in found)

    def test_calendar_events_always_and(self) -> None:
        event = CalendarEvent("Fri *-*-13 09:00", tz="UTC")
        found = list(event.elapses(datetime(2024, 1, 1, tzinfo=UTC), 2))
        assert [f.date().isoformat() for f in found] == ["2024-09-13", "2024-12-13"]


class TestTime:
    def test_strictly_after_and_in_the_zone(self) -> None:
        cron = CronExpression("0 9 * * *", tz=BERLIN)
        nine = datetime(2024, 1, 1, 9, tzinfo=BERLIN)
        found = cron.next_after(nine)
        assert found == nine + timedelta(days=1)
        assert found is not None and found.tzinfo is BERLIN
        assert cron.next_after(nine - timedelta(microseconds=1)) == nine

    def test_naive_is_refused(self) -> None:
        with pytest.raises(TimerError, match="naive"):
            CronExpression("* * * * *").next_after(datetime(2024, 1, 1))

    def test_a_nonexistent_wall_time_is_skipped(self) -> None:
        cron = CronExpression("30 2 * * *", tz=BERLIN)
        found = list(cron.elapses(datetime(2024, 3, 30, 12, tzinfo=BERLIN), 2))
        assert [f.day for f in found] == [1, 2]  # not on March 31

    def test_a_repeated_wall_time_fires_once(self) -> None:
        cron = CronExpression("*/30 * * * *", tz=BERLIN)
        found = list(cron.elapses(datetime(2024, 10, 27, 1, 50, tzinfo=BERLIN), 5))
        assert utc_hours(found) == [
            "10-27 00:00", "10-27 00:30", "10-27 02:00", "10-27 02:30", "10-27 03:00",
        ]  # fmt: skip

    def test_starting_inside_the_repeated_hour(self) -> None:
        cron = CronExpression("*/30 * * * *", tz=BERLIN)
        second_pass = datetime(2024, 10, 27, 2, 10, tzinfo=BERLIN, fold=1)
        found = cron.next_after(second_pass)
        assert found is not None
        assert found.astimezone(UTC) == datetime(2024, 10, 27, 1, 30, tzinfo=UTC)

    def test_rare_schedules(self) -> None:
        # The 5th Monday of February only exists in leap years starting on a Monday.
        cron = CronExpression("0 0 * 2 MON#5", tz="UTC")
        assert cron.next_after(datetime(2024, 3, 1, tzinfo=UTC)) == datetime(
            2044, 2, 29, tzinfo=UTC
        )

    def test_never(self) -> None:
        # Day 1 or 31 AND the 5th Monday of February: impossible; cronsim stops after
        # 50 years without a match.
        cron = CronExpression("0 0 */30 2 MON#5", tz="UTC")
        assert cron.next_after(datetime(2024, 1, 1, tzinfo=UTC)) is None


# Cron and calendar spellings of the same schedule have the same elapses, DST included.
EQUIVALENT = [
    ("*/15 * * * *", "*:0/15"),
    ("*/30 * * * *", "*:0/30"),
    ("0 * * * *", "hourly"),
    ("@hourly", "hourly"),
    ("* * * * *", "minutely"),
    ("@daily", "daily"),
    ("30 2 * * *", "*-*-* 02:30"),
    ("0 2 * * *", "*-*-* 02:00"),
    ("30 1 * * *", "*-*-* 01:30"),
    ("0 3 * * *", "*-*-* 03:00"),
    ("30 0 * * *", "*-*-* 00:30"),
    ("30 23 * * *", "*-*-* 23:30"),
    ("0,30 1-3 * * *", "*-*-* 01..03:00,30"),
    ("30 2 * * 0", "Sun *-*-* 02:30"),
    ("45 1,2 * * *", "*-*-* 01,02:45"),
]


@pytest.mark.parametrize(
    "case",
    [
        p
        for p in cases("calendar_dst.json")
        if p.values[0]["spec"] in dict((c, e) for e, c in EQUIVALENT)  # type: ignore[index]
    ],
)
def test_same_dst_rule_as_calendar_events(case: dict[str, object]) -> None:
    expression = next(e for e, c in EQUIVALENT if c == case["spec"])
    cron = CronExpression(expression, tz=str(case["zone"]))
    current = instant(str(case["base"]))
    elapses = case["elapses"]
    assert isinstance(elapses, list)
    for expected in elapses:
        found = cron.next_after(current)
        assert found is not None
        assert found.astimezone(UTC) == instant(expected), f"after {current.isoformat()}"
        current = found


def test_parse_dispatches_five_fields_to_cron() -> None:
    assert isinstance(parse("0 9 * * 1-5"), CronExpression)
    assert isinstance(parse("@daily"), CronExpression)
    with pytest.raises(TimerError, match="Invalid cron expression"):
        parse("0 9 * * 1-5 extra")
