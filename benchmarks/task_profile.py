"""Where a ``@task`` drain spends its time: CPU per thread, statements per task, two versions.

One ``runscheduler --burst`` process drains ``--tasks`` Django ``@task`` no-ops
(``DatabaseBackend``, default settings), run by two versions of the package, alternately
(``--base REF``, ``--head REF``, default: this working tree; see ``benchmarks/paired.py``,
whose checkouts and databases it shares). The node runs with ``benchapp_profile``, which
records:

- the CPU time of each thread kind (dispatcher: the main thread, start-up excluded by a run
  with nothing to drain; the workers; the completer...), per task drained;
- the SQL statements each thread kind sent, per task, and the connections it opened.

With ``--py-spy PATH`` (py-spy is not a dependency of the project: install it yourself),
each version's last drain also runs under ``py-spy record --gil --threads`` (samples of the
thread holding the GIL, so Python CPU): its top functions by own time and by time spent
inside them (the package's, and the rest).

Figures are medians over ``--rounds``. The machine is shared: CPU per task moves less with
the load than tasks/s do, and the rates are reported beside it anyway.

Usage::

    DATABASE_URL=postgres://root@127.0.0.1:5432/postgres \\
        python -m benchmarks.task_profile --base 173a994 --rounds 3 --py-spy /path/to/py-spy

Results: ``benchmarks/results/task_profile.json`` and ``.md`` (``--output``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks import paired as pr
from benchmarks.benchapp.drain import TASKS_TOPIC

#: Frames folded into their file's last path parts, for reading.
_PATH = re.compile(r" \((?:.*?/)?(site-packages|lib/python3\.\d+|django_tasks_coord)/")


def node(
    version: pr.Version, tasks: int, log: Path, py_spy: str | None, raw: Path
) -> tuple[float, dict[str, Any]]:
    """Fill ``version``'s queue with ``tasks`` ``@task`` no-ops and drain it with a profiled
    node; its wall time and profile."""
    version.run("benchmarks.benchapp.drain", "fill-tasks", str(tasks))
    env = version.env({})
    env.update(BENCH_APP="benchapp_profile", BENCH_PROFILE_LOG=str(log))
    cmd = [sys.executable, "-m", "django", "runscheduler", "--burst", "--topic", TASKS_TOPIC]
    cmd += ["-v", "0"]
    if py_spy:
        spy = [py_spy, "record", "-r", "250", "-f", "raw", "-o", str(raw), "--threads", "--gil"]
        cmd = [*spy, "--", *cmd]
    started = time.perf_counter()
    out = subprocess.run(
        cmd, cwd=version.source, env=env, capture_output=True, text=True, timeout=600
    )
    wall = time.perf_counter() - started
    if out.returncode:
        raise RuntimeError(
            f"{version.label}: the node exited {out.returncode}:\n{out.stderr[-3000:]}"
        )
    profile: dict[str, Any] = json.loads(log.read_text())
    if not Path(profile["package"]).resolve().is_relative_to(version.source.resolve()):
        raise RuntimeError(f"{version.label}'s node imported {profile['package']}")
    return wall, profile


def drained(version: pr.Version) -> dict[str, Any]:
    """The drain's figures from the task table (``benchapp/drain.py read``)."""
    row = json.loads(version.run("benchmarks.benchapp.drain", "read", "--topic", TASKS_TOPIC))
    seconds = (
        datetime.fromisoformat(row["last"]) - datetime.fromisoformat(row["first"])
    ).total_seconds()
    return {"done": row["done"], "drain_s": seconds}


def per_task(profile: dict[str, Any], startup_cpu: float, tasks: int) -> dict[str, Any]:
    """A node's profile per task: CPU (microseconds) by thread kind, statements by kind."""
    cpu = dict(profile["cpu_s"])
    cpu["MainThread"] = max(cpu.get("MainThread", 0.0) - startup_cpu, 0.0)
    statements: collections.Counter[str] = collections.Counter()
    for kind, statement, count in profile["statements"]:
        statements[f"{kind}: {statement}"] += count
    return {
        "cpu_us": {kind: round(seconds * 1e6 / tasks, 1) for kind, seconds in cpu.items()},
        "cpu_us_total": round(sum(cpu.values()) * 1e6 / tasks, 1),
        "statements": {k: round(n / tasks, 4) for k, n in statements.most_common()},
        "statements_total": round(sum(statements.values()) / tasks, 4),
        "connections": profile["connections"],
    }


def spy_summary(raw: Path, top: int = 25) -> dict[str, Any]:
    """py-spy's collapsed stacks: the top functions by own samples and by samples inside."""
    own: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        thread = re.sub(r"^thread \(\d+\):? ?", "", frames[0])
        if not thread:
            continue  # the start-up, before the main thread got its name
        total += n
        threads[re.sub(r"-\d+$", "", thread)] += n
        names = [re.sub(r":\d+\)$", ")", _PATH.sub(r" (\1/", f)) for f in frames[1:]]
        if names:
            own[names[-1]] += n
        for name in set(names):
            inside[name] += n
    share = lambda n: round(100 * n / total, 1) if total else 0.0  # noqa: E731
    return {
        "samples": total,
        "threads": {k: share(v) for k, v in threads.most_common()},
        "own": [[k, share(v)] for k, v in own.most_common(top)],
        "inside": [
            [k, share(v)]
            for k, v in inside.most_common(4 * top)
            if "django_tasks_coord/" in k or "django/" in k or "psycopg/" in k
        ][:top],
    }


def run(args: argparse.Namespace, versions: list[pr.Version], tmp: Path) -> dict[str, Any]:
    """Each version: a start-up run, then ``--rounds`` profiled drains, alternating."""
    startup = {}
    for version in versions:
        _, profile = node(version, 0, tmp / f"{version.label}-0.json", None, tmp / "x")
        startup[version.label] = profile["cpu_s"].get("MainThread", 0.0)
    samples: dict[str, list[dict[str, Any]]] = {v.label: [] for v in versions}
    spy: dict[str, Any] = {}
    for number in range(args.rounds):
        order = versions if number % 2 == 0 else versions[::-1]
        for version in order:
            last = number == args.rounds - 1
            raw = tmp / f"{version.label}.raw"
            log = tmp / f"{version.label}-{number}.json"
            wall, profile = node(version, args.tasks, log, args.py_spy if last else None, raw)
            figures = per_task(profile, startup[version.label], args.tasks)
            figures.update(drained(version), wall_s=round(wall, 3))
            figures["rate"] = round(args.tasks / figures["drain_s"])
            samples[version.label].append(figures)
            print(
                f"round {number + 1} {version.label}: {figures['rate']} tasks/s, "
                f"{figures['cpu_us_total']} us CPU/task, {figures['statements_total']} "
                "statements/task",
                flush=True,
            )
            if last and args.py_spy and raw.exists():
                spy[version.label] = spy_summary(raw)
    return {"startup_cpu_s": startup, "samples": samples, "py_spy": spy}


def medians(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-task figures of several drains: the median of each."""
    kinds = {k for s in samples for k in s["cpu_us"]}
    statements = {k for s in samples for k in s["statements"]}
    return {
        "rate": round(statistics.median(s["rate"] for s in samples)),
        "cpu_us_total": round(statistics.median(s["cpu_us_total"] for s in samples), 1),
        "cpu_us": {
            k: round(statistics.median(s["cpu_us"].get(k, 0.0) for s in samples), 1)
            for k in sorted(kinds)
        },
        "statements_total": round(statistics.median(s["statements_total"] for s in samples), 4),
        "statements": {
            k: round(statistics.median(s["statements"].get(k, 0.0) for s in samples), 4)
            for k in sorted(statements)
        },
        "worker_connections": statistics.median(s["connections"].get("worker", 0) for s in samples),
    }


def markdown(document: dict[str, Any]) -> str:
    """The report."""
    meta, summary = document["meta"], document["summary"]
    labels = list(summary)
    lines = [
        "# Where a `@task` drain spends its time",
        "",
        f"{meta['date']}; {meta['machine']}; {meta['database']}. Base `{meta['base']['ref']}` "
        f"({meta['base']['revision']}), head `{meta['head']['ref']}` ({meta['head']['revision']}). "
        f"{meta['tasks']:,} Django `@task` no-ops per drain, one `runscheduler --burst` with the "
        f"default settings, {meta['rounds']} rounds (medians), the version going first "
        f"alternating. Load average {meta['load_start']} / {meta['load_end']}.",
        "",
        "## CPU per task (microseconds), by thread",
        "",
        "The main thread is the dispatcher (its start-up, measured by a run with nothing to "
        "drain, is taken out); the workers run the tasks; the completer writes the outcomes.",
        "",
        "| thread | " + " | ".join(labels) + " |",
        "| --- | " + " | ".join("---:" for _ in labels) + " |",
    ]
    kinds = sorted({k for s in summary.values() for k in s["cpu_us"]})
    for kind in kinds:
        cells = [str(summary[label]["cpu_us"].get(kind, "-")) for label in labels]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines.append(
        "| **all** | " + " | ".join(f"**{summary[lb]['cpu_us_total']}**" for lb in labels) + " |"
    )
    lines.append(
        "| drain rate (tasks/s) | " + " | ".join(f"{summary[lb]['rate']:,}" for lb in labels) + " |"
    )
    lines += [
        "",
        "## SQL statements per task, by thread and statement",
        "",
        "Counted by an execute wrapper (`BEGIN`/`COMMIT` are not statements Django executes).",
        "",
        "| thread: statement | " + " | ".join(labels) + " |",
        "| --- | " + " | ".join("---:" for _ in labels) + " |",
    ]
    statements = sorted(
        {k for s in summary.values() for k in s["statements"]},
        key=lambda k: -max(s["statements"].get(k, 0) for s in summary.values()),
    )
    for key in statements[:15]:
        cells = [str(summary[label]["statements"].get(key, 0)) for label in labels]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines.append(
        "| **all** | "
        + " | ".join(f"**{summary[lb]['statements_total']}**" for lb in labels)
        + " |"
    )
    lines.append(
        "| connections opened by the workers | "
        + " | ".join(str(summary[lb]["worker_connections"]) for lb in labels)
        + " |"
    )
    for label, spy in document["py_spy"].items():
        lines += [
            "",
            f"## py-spy, {label}: samples of the thread holding the GIL ({spy['samples']:,})",
            "",
            "Threads: " + ", ".join(f"{k} {v}%" for k, v in spy["threads"].items()) + ".",
            "",
            "| own time: function | % |",
            "| --- | ---: |",
            *(f"| `{name}` | {pct} |" for name, pct in spy["own"][:20]),
            "",
            "| time inside: function | % |",
            "| --- | ---: |",
            *(f"| `{name}` | {pct} |" for name, pct in spy["inside"][:25]),
        ]
    lines += ["", f"Command: `{meta['command']}`.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git ref of the version before")
    parser.add_argument("--head", default=pr.WORKTREE, help=f"git ref, or {pr.WORKTREE}")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or "sqlite://")
    parser.add_argument("--name", default="bench_profile", help="databases NAME_base, NAME_head")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--py-spy", default=None, help="py-spy's path: profile the last drains")
    parser.add_argument("--output", default="task_profile")
    args = parser.parse_args()
    started, load_start = time.monotonic(), common.load_average()
    with tempfile.TemporaryDirectory(prefix="bench_profile_") as name:
        tmp = Path(name)
        versions = pr.prepare(args, tmp)
        measured = run(args, versions, tmp)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": common.machine(),
        "database": common.LABELS[common.vendor_of(versions[0].config)],
        "tasks": args.tasks,
        "rounds": args.rounds,
        "command": "python -m benchmarks.task_profile " + " ".join(sys.argv[1:]),
        "load_start": load_start,
        "load_end": common.load_average(),
        "duration_min": round((time.monotonic() - started) / 60, 1),
        **{v.label: {"ref": v.ref, "revision": v.revision} for v in versions},
    }
    summary = {label: medians(s) for label, s in measured["samples"].items()}
    document = {"meta": meta, "summary": summary, **measured}
    common.write_report(args.output, document, lambda: markdown(document))


if __name__ == "__main__":
    main()
