"""Fixed-rate intervals and one-time timers."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers import Interval, OneTime, parse
from django_tasks_coord.timers.interval import format_duration, parse_duration

BERLIN = ZoneInfo("Europe/Berlin")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TestDurations:
    @pytest.mark.parametrize(
        ("text", "expected", "canonical"),
        [
            ("30s", timedelta(seconds=30), "30s"),
            ("5m", timedelta(minutes=5), "5m"),
            ("1h30m", timedelta(minutes=90), "1h30m"),
            ("90m", timedelta(minutes=90), "1h30m"),
            ("2d", timedelta(days=2), "2d"),
            ("1d 12h", timedelta(hours=36), "1d12h"),
            ("14 days", timedelta(days=14), "2w"),
            ("1 hour 1 second", timedelta(hours=1, seconds=1), "1h1s"),
            ("1500ms", timedelta(seconds=1.5), "1s500ms"),
            ("7us", timedelta(microseconds=7), "7us"),
            ("1H", timedelta(hours=1), "1h"),
        ],
    )
    def test_parse_and_format(self, text: str, expected: timedelta, canonical: str) -> None:
        assert parse_duration(text) == expected
        assert format_duration(expected) == canonical

    @pytest.mark.parametrize("text", ["", "5", "5 parsecs", "1.5h", "-5m", "0s", "m"])
    def test_invalid(self, text: str) -> None:
        with pytest.raises(TimerError):
            parse_duration(text)


class TestInterval:
    def test_parse(self) -> None:
        timer = parse("every 30s")
        assert isinstance(timer, Interval)
        assert timer.period == timedelta(seconds=30)
        assert timer.anchor == EPOCH
        assert str(timer) == "every 30s"
        assert parse("Every 1h30m") == Interval(timedelta(minutes=90))
        assert parse(timedelta(minutes=5)) == Interval(timedelta(minutes=5))

    def test_fixed_rate_from_the_epoch(self) -> None:
        timer = Interval(timedelta(minutes=5), tz="UTC")
        start = datetime(2024, 1, 1, 10, 2, 17, tzinfo=UTC)
        assert list(timer.elapses(start, 3)) == [
            datetime(2024, 1, 1, 10, 5, tzinfo=UTC),
            datetime(2024, 1, 1, 10, 10, tzinfo=UTC),
            datetime(2024, 1, 1, 10, 15, tzinfo=UTC),
        ]

    def test_no_drift_whenever_it_is_asked(self) -> None:
        timer = Interval(timedelta(seconds=7), anchor=datetime(2024, 1, 1, tzinfo=UTC))
        late = datetime(2024, 1, 1, 0, 0, 20, 999999, tzinfo=UTC)  # a run that started late
        assert timer.next_after(late) == datetime(2024, 1, 1, 0, 0, 21, tzinfo=UTC)

    def test_strictly_after_on_the_boundary(self) -> None:
        timer = Interval(timedelta(hours=1))
        hour = datetime(2024, 1, 1, 10, tzinfo=UTC)
        assert timer.next_after(hour) == hour + timedelta(hours=1)
        assert timer.next_after(hour - timedelta(microseconds=1)) == hour

    def test_anchor(self) -> None:
        anchor = datetime(2024, 1, 1, 6, tzinfo=BERLIN)
        timer = Interval(timedelta(days=1), anchor=anchor, tz=BERLIN)
        assert timer.next_after(datetime(2023, 1, 1, tzinfo=UTC)) == anchor  # before it
        # Fixed rate in real time: 24 hours apart, so 07:00 local once DST starts.
        found = timer.next_after(datetime(2024, 4, 1, 12, tzinfo=UTC))
        assert found == datetime(2024, 4, 2, 7, tzinfo=BERLIN)
        assert found is not None and found.tzinfo is BERLIN
        assert str(timer) == "every 1d from 2024-01-01T06:00:00+01:00"
        assert parse(str(timer), tz=BERLIN) == timer

    def test_naive_anchor_is_read_in_the_zone(self) -> None:
        timer = Interval(timedelta(hours=2), anchor=datetime(2024, 1, 1, 1), tz=BERLIN)
        assert timer.anchor == datetime(2024, 1, 1, 1, tzinfo=BERLIN)

    def test_parse_with_anchor(self) -> None:
        timer = parse("every 1d from 2024-01-01T06:00:00+01:00")
        assert isinstance(timer, Interval)
        assert timer.anchor == datetime(2024, 1, 1, 5, tzinfo=UTC)

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            ("every", "write 'every <duration>'"),
            ("every 0s", "longer than zero"),
            ("every 5 fortnights", "cannot read the duration at '5 fortnights'"),
            ("every 5m from yesterday", "'yesterday' is not an ISO 8601 datetime"),
        ],
    )
    def test_errors(self, spec: str, message: str) -> None:
        with pytest.raises(TimerError) as raised:
            parse(spec)
        assert message in str(raised.value)
        assert repr(spec) in str(raised.value)

    @pytest.mark.parametrize("period", [timedelta(0), timedelta(seconds=-1), 30])
    def test_invalid_period(self, period: object) -> None:
        with pytest.raises(TimerError):
            Interval(period)  # type: ignore[arg-type]

    def test_value_object(self) -> None:
        timer = Interval(timedelta(minutes=5), tz="Europe/Berlin")
        assert timer == Interval(timedelta(seconds=300), tz=BERLIN)
        assert hash(timer) == hash(Interval(timedelta(seconds=300), tz=BERLIN))
        assert timer != Interval(timedelta(minutes=5), anchor=datetime(2024, 1, 1, tzinfo=UTC))
        assert repr(timer) == "Interval('every 5m', tz='Europe/Berlin')"
        assert pickle.loads(pickle.dumps(timer)) == timer
        with pytest.raises(AttributeError):
            timer._period = timedelta(1)  # type: ignore[misc]

    def test_naive_is_refused(self) -> None:
        with pytest.raises(TimerError, match="naive"):
            Interval(timedelta(1)).next_after(datetime(2024, 1, 1))


class TestOneTime:
    def test_fires_once(self) -> None:
        timer = parse("2026-12-01T09:00:00+01:00")
        assert isinstance(timer, OneTime)
        at = datetime(2026, 12, 1, 8, tzinfo=UTC)
        assert timer.next_after(at - timedelta(days=30)) == at
        assert timer.next_after(at - timedelta(microseconds=1)) == at
        assert timer.next_after(at) is None
        assert timer.next_after(at + timedelta(days=1)) is None
        assert list(timer.elapses(at - timedelta(days=1))) == [at]

    def test_naive_iso_is_read_in_the_zone(self) -> None:
        timer = parse("2026-07-01T09:00", tz="Europe/Berlin")
        assert isinstance(timer, OneTime)
        assert timer.at == datetime(2026, 7, 1, 7, tzinfo=UTC)
        assert str(timer) == "2026-07-01T09:00:00+02:00"

    def test_a_wall_time_in_a_dst_gap_moves_forward(self) -> None:
        timer = OneTime(datetime(2024, 3, 31, 2, 30), tz=BERLIN)
        assert timer.at.astimezone(UTC) == datetime(2024, 3, 31, 1, 30, tzinfo=UTC)  # 03:30 CEST

    def test_datetime_objects(self) -> None:
        at = datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=-5)))
        timer = parse(at, tz="UTC")
        assert timer == OneTime(at, tz="UTC")
        found = timer.next_after(datetime(2029, 1, 1, tzinfo=UTC))
        assert found == at
        assert found is not None and found.tzinfo is UTC

    def test_roundtrip_and_value_object(self) -> None:
        timer = OneTime("2026-12-01T09:00:00Z", tz="UTC")
        assert parse(str(timer), tz="UTC") == timer
        assert repr(timer) == "OneTime('2026-12-01T09:00:00+00:00', tz='UTC')"
        assert pickle.loads(pickle.dumps(timer)) == timer
        assert len({timer, OneTime("2026-12-01T10:00:00+01:00", tz="UTC")}) == 1

    def test_invalid(self) -> None:
        with pytest.raises(TimerError, match="Invalid ISO 8601 datetime '2026-13-01T00:00'"):
            parse("2026-13-01T00:00")
        with pytest.raises(TimerError, match="must be a datetime"):
            OneTime(20261201)  # type: ignore[arg-type]
