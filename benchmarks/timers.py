"""Benchmark: 10,000 successive elapses, calendar events vs cronsim, in Europe/Berlin.

Run from the repository root::

    python -m benchmarks.timers [--runs 7] [--count 10000]

Two schedules, each spelled as a systemd calendar event (``timers.CalendarEvent``)
and as the equivalent cron expression:

* ``*:0/5``                    vs ``*/5 * * * *``
* ``Mon..Fri *-*-* 09:00:00``  vs ``0 9 * * 1-5``

Ours: ``event.next_after(previous)`` 10,000 times (stateless calls, each from the
previous elapse). cronsim: ``next()`` on one ``CronSim`` iterator 10,000 times (its
fastest use). Both start at 2024-01-01 00:00 Europe/Berlin and must produce the same
instants (checked). Each figure is the median of ``--runs`` runs in this process;
"cold" runs first clear our per-zone caches (DST transition tables), "warm" runs keep
them. Results are printed and written to ``benchmarks/results/timers.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from zoneinfo import ZoneInfo

from cronsim import CronSim

from benchmarks.common import RESULTS, ROOT
from django_tasks_coord.timers import (
    CalendarEvent,
    CronExpression,
    _localtime,
)

ZONE = ZoneInfo("Europe/Berlin")
START = datetime(2024, 1, 1, tzinfo=ZONE)
CASES = [
    ("*:0/5", "*/5 * * * *"),
    ("Mon..Fri *-*-* 09:00:00", "0 9 * * 1-5"),
]


def clear_caches() -> None:
    _localtime._transitions_in_year.cache_clear()
    _localtime._quiet.clear()


def elapses(timer: CalendarEvent | CronExpression, count: int) -> list[datetime]:
    """``count`` successive elapses of ``timer`` from :data:`START`, each from the previous."""
    out = []
    current: datetime | None = START
    for _ in range(count):
        current = timer.next_after(current)  # type: ignore[arg-type]
        assert current is not None
        out.append(current)
    return out


def ours(spec: str, count: int) -> list[datetime]:
    return elapses(CalendarEvent(spec, tz=ZONE), count)


def our_cron(expression: str, count: int) -> list[datetime]:
    return elapses(CronExpression(expression, tz=ZONE), count)


def cronsim(expression: str, count: int) -> list[datetime]:
    iterator = CronSim(expression, START)
    return [next(iterator) for _ in range(count)]


def timed(
    candidates: dict[str, tuple[Callable[[], object], Callable[[], None]]], runs: int
) -> dict[str, list[float]]:
    """Run each candidate ``runs`` times, round-robin (so machine noise hits all alike)."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(runs):
        for name, (function, before) in candidates.items():
            before()
            gc.collect()
            started = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--count", type=int, default=10_000)
    args = parser.parse_args()
    count, runs = args.count, args.runs

    results = []
    for spec, expression in CASES:
        mine = ours(spec, count)
        theirs = cronsim(expression, count)
        if [m.astimezone(UTC) for m in mine] != [t.astimezone(UTC) for t in theirs]:
            sys.exit(f"{spec!r} and {expression!r} disagree")

        def nothing() -> None:
            pass

        times = timed(
            {
                "cold": (lambda s=spec: ours(s, count), clear_caches),  # type: ignore[misc]
                "warm": (lambda s=spec: ours(s, count), nothing),  # type: ignore[misc]
                "cronsim": (lambda e=expression: cronsim(e, count), nothing),  # type: ignore[misc]
                "wrapped": (lambda e=expression: our_cron(e, count), nothing),  # type: ignore[misc]
            },
            runs,
        )
        cold, warm, reference, wrapped = (
            times["cold"], times["warm"], times["cronsim"], times["wrapped"]
        )  # fmt: skip
        results.append(
            {
                "calendar_event": spec,
                "cron": expression,
                "elapses": count,
                "last_elapse": mine[-1].isoformat(),
                "ours_ms_median_warm": round(statistics.median(warm) * 1000, 1),
                "ours_ms_median_cold": round(statistics.median(cold) * 1000, 1),
                "cronsim_ms_median": round(statistics.median(reference) * 1000, 1),
                "our_cron_wrapper_ms_median": round(statistics.median(wrapped) * 1000, 1),
                "speedup_warm": round(statistics.median(reference) / statistics.median(warm), 2),
                "speedup_cold": round(statistics.median(reference) / statistics.median(cold), 2),
            }
        )

    print(f"{count} successive elapses in Europe/Berlin from {START.isoformat()}, "
          f"median of {runs} runs (ms)")  # fmt: skip
    header = (
        f"{'calendar event':26} {'ours warm':>10} {'ours cold':>10} {'cronsim':>9} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in results:
        print(
            f"{row['calendar_event']:26} {row['ours_ms_median_warm']:10.1f} "
            f"{row['ours_ms_median_cold']:10.1f} {row['cronsim_ms_median']:9.1f} "
            f"{row['speedup_warm']:5.2f}x"
        )
    print("(ratio: cronsim time / our warm time; > 1 means we are faster)")
    print("CronExpression (cronsim + our DST rule, stateless calls), for reference:")
    for row in results:
        print(f"  {row['cron']:26} {row['our_cron_wrapper_ms_median']:10.1f}")

    output = RESULTS / "timers.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "benchmarks/timers.py",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cronsim": metadata.version("cronsim"),
        "runs": runs,
        "results": results,
    }
    output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"written to {output.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
