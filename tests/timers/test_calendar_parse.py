"""Calendar events: accepted syntax and normalized form, against systemd-analyze 252."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings

from django_tasks_coord.exceptions import TasksCoordError, TimerError
from django_tasks_coord.timers import CalendarEvent, parse
from django_tasks_coord.timers.base import get_zone, zone_name
from django_tasks_coord.timers.calendar import parse_calendar_spec
from tests.timers._data import cases, load


@pytest.mark.parametrize("case", cases("calendar_curated.json", "calendar_random.json"))
def test_validity_and_normalized_form_match_systemd(case: dict[str, object]) -> None:
    spec = case["spec"]
    assert isinstance(spec, str)
    if case["valid"]:
        assert str(CalendarEvent(spec, tz=str(case["zone"]))) == case["normalized"]
    else:
        with pytest.raises(TimerError):
            CalendarEvent(spec)


def test_data_comes_from_systemd_252_or_later() -> None:
    for name in ("calendar_curated.json", "calendar_dst.json", "calendar_random.json"):
        version = load(name)["systemd"]
        assert version.startswith("systemd ")
        assert int(version.split()[1]) >= 252


@pytest.mark.parametrize(
    ("spec", "normalized"),
    [
        # The examples of systemd.time(7).
        ("Sat,Thu,Mon..Wed,Sat..Sun", "Mon..Thu,Sat,Sun *-*-* 00:00:00"),
        ("Sat,Thu,Mon-Wed,Sat-Sun", "Mon..Thu,Sat,Sun *-*-* 00:00:00"),
        ("Mon,Sun 12-*-* 2,1:23", "Mon,Sun 2012-*-* 01,02:23:00"),
        ("Wed *-1", "Wed *-*-01 00:00:00"),
        ("Wed..Wed,Wed *-1", "Wed *-*-01 00:00:00"),
        ("Wed, 17:48", "Wed *-*-* 17:48:00"),
        ("Wed..Sat,Tue 12-10-15 1:2:3", "Tue..Sat 2012-10-15 01:02:03"),
        ("*-*-7 0:0:0", "*-*-07 00:00:00"),
        ("10-15", "*-10-15 00:00:00"),
        ("monday *-12-* 17:00", "Mon *-12-* 17:00:00"),
        ("Mon,Fri *-*-3,1,2 *:30:45", "Mon,Fri *-*-01,02,03 *:30:45"),
        ("12,14,13,12:20,10,30", "*-*-* 12,13,14:10,20,30:00"),
        ("12..14:10,20,30", "*-*-* 12..14:10,20,30:00"),
        ("mon,fri *-1/2-1,3 *:30:45", "Mon,Fri *-01/2-01,03 *:30:45"),
        ("03-05 08:05:40", "*-03-05 08:05:40"),
        ("08:05:40", "*-*-* 08:05:40"),
        ("05:40", "*-*-* 05:40:00"),
        ("Sat,Sun 12-05 08:05:40", "Sat,Sun *-12-05 08:05:40"),
        ("Sat,Sun 08:05:40", "Sat,Sun *-*-* 08:05:40"),
        ("2003-03-05 05:40", "2003-03-05 05:40:00"),
        ("05:40:23.4200004/3.1700005", "*-*-* 05:40:23.420000/3.170001"),
        ("2003-02..04-05", "2003-02..04-05 00:00:00"),
        ("2003-03-05 05:40 UTC", "2003-03-05 05:40:00 UTC"),
        ("2003-03-05", "2003-03-05 00:00:00"),
        ("03-05", "*-03-05 00:00:00"),
        ("hourly", "*-*-* *:00:00"),
        ("daily", "*-*-* 00:00:00"),
        ("daily UTC", "*-*-* 00:00:00 UTC"),
        ("monthly", "*-*-01 00:00:00"),
        ("weekly", "Mon *-*-* 00:00:00"),
        ("weekly Pacific/Auckland", "Mon *-*-* 00:00:00 Pacific/Auckland"),
        ("yearly", "*-01-01 00:00:00"),
        ("annually", "*-01-01 00:00:00"),
        ("*:2/3", "*-*-* *:02/3:00"),
        # Every shorthand.
        ("minutely", "*-*-* *:*:00"),
        ("quarterly", "*-01,04,07,10-01 00:00:00"),
        ("semiannually", "*-01,07-01 00:00:00"),
        ("semi-annually", "*-01,07-01 00:00:00"),
        ("biannually", "*-01,07-01 00:00:00"),
        ("bi-annually", "*-01,07-01 00:00:00"),
        ("anually", "*-01-01 00:00:00"),
        # @epoch, two-digit years, "~", ranges trimmed to whole repetitions.
        ("@1700000000", "2023-11-14 22:13:20 UTC"),
        ("70-01-01", "1970-01-01 00:00:00"),
        ("69-01-01", "2069-01-01 00:00:00"),
        ("Mon *-05~07/1", "Mon *-05~07/1 00:00:00"),
        ("*-*~1..7", "*-*~01..07 00:00:00"),
        ("*-*-1..6/2", "*-*-01..05/2 00:00:00"),
        ("*:0..59/15", "*-*-* *:00..45/15:00"),
        ("*-*~*", "*-*-* 00:00:00"),
        ("Mon..Sun", "*-*-* 00:00:00"),
        ("*:*:0/1,5.5", "*-*-* *:*:*"),
    ],
)
def test_normalized_form(spec: str, normalized: str) -> None:
    assert str(CalendarEvent(spec)) == normalized
    assert CalendarEvent(spec).normalized == normalized


@pytest.mark.parametrize(
    ("spec", "pointed_at"),
    [
        ("*:50/10", "'50/10'"),
        ("Fri..Mon", "'Fri..Mon'"),
        ("*-*-* 00:00 Z", "'Z'"),
        ("*-13-01", "'13'"),
        ("*:*:60", "'60'"),
        ("*-*~04,17,28", "'28'"),
        ("Mon..Wed..Fri", "'Mon..Wed..Fri'"),
        ("Mond", "'Mond'"),
        ("12:", "end"),
        ("*:*:0/0.0000001", "'0/0.0000001'"),
        ("@7258118400", "'@7258118400'"),
        ("1969-01-01", "'1969'"),
        ("daily ", "'daily '"),
        ("*-*-* *:xx", "'xx'"),
        ("*-1x", "'x'"),
    ],
)
def test_errors_quote_the_spec_and_point_at_the_offending_part(spec: str, pointed_at: str) -> None:
    with pytest.raises(TimerError) as raised:
        CalendarEvent(spec)
    message = str(raised.value)
    assert repr(spec) in message
    assert pointed_at in message


def test_timer_error_is_a_value_error_and_a_package_error() -> None:
    with pytest.raises(ValueError, match="Invalid calendar event"):
        CalendarEvent("*:50/10")
    assert issubclass(TimerError, TasksCoordError)


def test_a_repetition_of_star_is_refused_as_systemd_does() -> None:
    # systemd has no "*/5"; "0/5" is the way to say it.
    with pytest.raises(TimerError):
        CalendarEvent("*:*/5")
    assert str(CalendarEvent("*:0/5")) == "*-*-* *:00/5:00"


@pytest.mark.parametrize("value", [None, 5, b"daily"])
def test_non_string_specs_are_refused(value: object) -> None:
    with pytest.raises(TimerError, match="must be a string"):
        CalendarEvent(value)  # type: ignore[arg-type]


def test_parse_calendar_spec_exposes_the_fields() -> None:
    spec = parse_calendar_spec("Mon..Fri *-*~1..3 09:00 Europe/Berlin")
    assert spec.weekdays == 0b0011111
    assert spec.end_of_month is True
    assert spec.day == ((1, 3, 1),)
    assert spec.hour == ((9, -1, 0),)
    assert spec.usec == ((0, -1, 0),)
    assert spec.timezone == "Europe/Berlin"
    assert spec.utc is False


class TestZones:
    def test_the_zone_in_the_spec_wins(self) -> None:
        event = CalendarEvent("daily Asia/Tokyo", tz="Europe/Berlin")
        assert event.tz == ZoneInfo("Asia/Tokyo")
        assert event == CalendarEvent("daily Asia/Tokyo")

    def test_utc_suffix_in_any_case(self) -> None:
        assert CalendarEvent("daily utc", tz="Europe/Berlin").tz is UTC
        assert str(CalendarEvent("daily utc")) == "*-*-* 00:00:00 UTC"

    def test_the_given_zone(self) -> None:
        event = CalendarEvent("daily", tz="America/New_York")
        start = datetime(2024, 7, 1, 12, tzinfo=UTC)
        assert event.next_after(start) == datetime(2024, 7, 2, 4, tzinfo=UTC)
        assert event.tz == ZoneInfo("America/New_York")

    def test_zoneinfo_and_fixed_offsets_are_accepted(self) -> None:
        fixed = timezone(timedelta(hours=5, minutes=30))
        event = CalendarEvent("daily", tz=fixed)
        assert event.next_after(datetime(2024, 1, 1, tzinfo=UTC)) == datetime(
            2024, 1, 1, 18, 30, tzinfo=UTC
        )
        assert CalendarEvent("daily", tz=ZoneInfo("Asia/Kolkata")).tz == ZoneInfo("Asia/Kolkata")

    @pytest.mark.parametrize(
        "zone",
        [
            UTC,
            ZoneInfo("Europe/Berlin"),
            timezone(timedelta(hours=5, minutes=30)),
            timezone(timedelta(hours=-3, seconds=-15)),
        ],
    )
    def test_zone_names_read_back(self, zone: ZoneInfo | timezone) -> None:
        assert get_zone(zone_name(zone)).utcoffset(datetime(2024, 1, 1)) == zone.utcoffset(
            datetime(2024, 1, 1)
        )
        assert zone_name(get_zone(zone_name(zone))) == zone_name(zone)

    def test_unknown_zone_argument(self) -> None:
        with pytest.raises(TimerError, match="Unknown time zone 'Mars/Olympus'"):
            CalendarEvent("daily", tz="Mars/Olympus")

    @override_settings(TIME_ZONE="Asia/Tokyo")
    def test_default_is_django_time_zone(self) -> None:
        assert CalendarEvent("daily").tz == ZoneInfo("Asia/Tokyo")
        assert parse("daily").tz == ZoneInfo("Asia/Tokyo")

    def test_default_is_utc_without_django_settings(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        code = (
            "from django_tasks_coord import timers; "
            "print(timers.parse('daily').tz, timers.CalendarEvent('hourly').tz)"
        )
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            check=True,
        )
        assert result.stdout.split() == ["UTC", "UTC"]

    def test_local_zone_abbreviations_are_read_as_iana_names(self) -> None:
        # systemd reads "CET" as "the local zone with DST off" when the machine's zone
        # is CET/CEST; there is no machine zone here, so it is the IANA zone "CET".
        assert CalendarEvent("daily CET").tz == ZoneInfo("CET")


class TestValueObject:
    def test_equal_and_hashable(self) -> None:
        a = CalendarEvent("Mon-Fri 9:00", tz="Europe/Berlin")
        b = CalendarEvent("Mon..Fri *-*-* 09:00:00", tz=ZoneInfo("Europe/Berlin"))
        assert a == b
        assert hash(a) == hash(b)
        assert a != CalendarEvent("Mon..Fri 09:00", tz="UTC")
        assert len({a, b}) == 1

    def test_repr_and_original(self) -> None:
        event = CalendarEvent("Mon-Fri 9:00", tz="Europe/Berlin")
        assert repr(event) == "CalendarEvent('Mon..Fri *-*-* 09:00:00', tz='Europe/Berlin')"
        assert event.original == "Mon-Fri 9:00"

    def test_immutable(self) -> None:
        event = CalendarEvent("daily")
        with pytest.raises(AttributeError, match="immutable"):
            event._tz = UTC  # type: ignore[misc]
        with pytest.raises(AttributeError, match="immutable"):
            del event._tz

    @pytest.mark.parametrize("tz", ["Europe/Berlin", timezone(timedelta(hours=-3)), UTC])
    def test_pickle(self, tz: ZoneInfo | timezone) -> None:
        event = CalendarEvent("Mon..Fri 09:00", tz=tz)
        assert pickle.loads(pickle.dumps(event)) == event
