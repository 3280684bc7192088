"""Fuzzing: whatever the input, ``parse`` returns a timer or raises ``TimerError``.

No other exception, no hang: every example (parsing plus a few elapses) must finish
within a generous time bound.
"""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers import CalendarEvent, CronExpression, Timer, parse

# Characters that mean something in one of the syntaxes, plus a few that do not.
SYNTAX = "0123456789*-~:.,/@ ~+TZ\t\nMonTueWedThuFriSatSunUTCeveryhmsdwLW#?JANmonthly"
FUZZ = settings(
    max_examples=2500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
BASE = datetime(2024, 6, 1, tzinfo=UTC)
LIMIT_SECONDS = 2.0  # per example; a hang would blow far past it


def exercise(text: str, build: type[Timer] | None = None) -> None:
    started = time.perf_counter()
    try:
        timer = parse(text) if build is None else build(text)  # type: ignore[call-arg]
    except TimerError:
        timer = None
    if timer is not None:
        assert isinstance(timer, Timer)
        assert isinstance(str(timer), str)
        current: datetime | None = BASE
        for _ in range(3):
            found = timer.next_after(current)  # type: ignore[arg-type]
            assert found is None or found > current  # type: ignore[operator]
            if found is None:
                break
            current = found
    assert time.perf_counter() - started < LIMIT_SECONDS, f"too slow: {text!r}"


@FUZZ
@given(st.text(alphabet=SYNTAX, max_size=40))
def test_parse_syntax_soup(text: str) -> None:
    exercise(text)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=30))
def test_parse_any_unicode(text: str) -> None:
    exercise(text)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=SYNTAX, max_size=40))
def test_calendar_event_syntax_soup(text: str) -> None:
    exercise(text, CalendarEvent)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.text(alphabet="0123456789*-,/LW#?JANMONSUN", max_size=6), min_size=5, max_size=5)
)
def test_cron_fields(fields: list[str]) -> None:
    exercise(" ".join(fields), CronExpression)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.integers(), st.floats(), st.binary(), st.lists(st.integers())))
def test_parse_other_types(value: object) -> None:
    with contextlib.suppress(TimerError):
        parse(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec", ["daily", "Mon..Fri 09:00 Asia/Tokyo", "0 9 * * 1-5", "every 5m", "2026-12-01T09:00Z"]
)
@pytest.mark.parametrize("tz", ["UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago"])
def test_extreme_instants(spec: str, tz: str) -> None:
    timer = parse(spec, tz=tz)
    for moment in (datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)):
        found = timer.next_after(moment)
        assert found is None or found > moment
    assert timer.next_after(datetime.max.replace(tzinfo=UTC)) is None
