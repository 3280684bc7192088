"""Our node's drain rate, two versions of the package against each other in one run.

The measurement is ``benchmarks/throughput.py``'s "ours": one ``runscheduler --burst``
process drains ``--tasks`` no-op tasks; rate = tasks / (last ``finished_at`` - first
``started_at``), read from the task table (process start-up excluded; the process's wall
time is kept beside it). It is run by two versions of ``django_tasks_coord``:

- ``--base REF`` and ``--head REF`` (default: this working tree, uncommitted changes
  included): ``git archive REF django_tasks_coord`` unpacked in a temporary directory,
  which comes first on the nodes' ``PYTHONPATH`` (``cluster.Cluster(source=...)``). The
  benchmark's own code (``benchmarks.settings``, the ``noop`` consumer) is this checkout's
  for both; each subprocess reports the package it imported, and the run fails if it is not
  the version's.
- Each version has its own database, ``NAME_base`` and ``NAME_head`` (``--name``, default
  ``bench_paired``) on the server of ``--database-url`` (default ``$DATABASE_URL``; without
  it, SQLite files in the temp directory), migrated by its own migrations, filled and read
  by its own code (``benchmarks.benchapp.drain``), emptied and analyzed before each drain.
- Each round drains once per version and per node settings (``--settings``:
  ``tuned`` = throughput.py's ``TUNED``, ``defaults``); which version goes first alternates
  from round to round (base-head, head-base, ...), so neither always runs second.

Figures: per version and settings, the median rate over ``--rounds`` (at least 3); per
round, head / base; the median of those ratios and their range. Two copies of one commit
(``--base X --head X``) show the noise of the machine: a change is a regression beyond
noise when its ratios fall below that range.

Usage (PostgreSQL; ``DATABASE_URL`` names the server, ``--name`` the databases)::

    DATABASE_URL=postgres://root@127.0.0.1:5432/postgres \\
        python -m benchmarks.paired --base ace9ca6 --head ace9ca6 --output throughput_paired_noise
    DATABASE_URL=postgres://root@127.0.0.1:5432/postgres \\
        python -m benchmarks.paired --base ace9ca6          # against this working tree

Results: ``benchmarks/results/OUTPUT.json`` and ``.md`` (``--output``, default
``throughput_paired``).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks import django_tasks as task_bench
from benchmarks.benchapp.drain import TASKS_TOPIC
from benchmarks.cluster import run_node
from benchmarks.throughput import TOPIC, TUNED

WORKTREE = "WORKTREE"
#: What a node drains: ``consumer``, the ``noop`` consumer's tasks (throughput.py's "ours"),
#: or ``task``, Django ``@task`` no-ops through ``DatabaseBackend`` (django_tasks.py's).
KINDS = ("consumer", "task")
#: Node settings per kind: ``tuned`` is each benchmark's tuning.
SETTINGS = {
    "consumer": {"tuned": TUNED, "defaults": {}},
    "task": {"tuned": task_bench.TUNED, "defaults": {}},
}


@dataclasses.dataclass
class Version:
    """One version of the package: where its code is, its database and its environment."""

    label: str  # "base" or "head"
    ref: str  # a git ref, or WORKTREE
    revision: str  # the commit (and whether the tree differs from it)
    source: Path  # the directory whose django_tasks_coord the nodes import
    config: dict[str, Any]  # its DATABASES entry

    def env(self, tasks_coord: dict[str, Any] | None = None) -> dict[str, str]:
        env = common.bench_env(self.config, tasks_coord=tasks_coord, BENCH_TASKS_BACKEND="1")
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(self.source), str(common.ROOT)]))
        return env

    def run(self, *args: str) -> str:
        """``python -m ARGS`` with this version's package; its output. Raise if it fails."""
        out = subprocess.run(
            [sys.executable, "-m", *args],
            cwd=self.source,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode:
            output = (out.stdout + out.stderr)[-3000:]
            raise RuntimeError(f"{self.label}: {' '.join(args)} exited {out.returncode}:\n{output}")
        return out.stdout


def checkout(ref: str, label: str, into: Path) -> tuple[Path, str]:
    """The directory holding ``ref``'s ``django_tasks_coord`` (unpacked under ``into``), and
    the commit it is; the working tree itself for :data:`WORKTREE`."""
    if ref == WORKTREE:
        return common.ROOT, common.git_revision()
    commit = common.git("rev-parse", "--verify", f"{ref}^{{commit}}")
    if not commit:
        raise SystemExit(f"Unknown git ref {ref!r}.")
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "django_tasks_coord"],
        cwd=common.ROOT,
        capture_output=True,
        check=True,
    ).stdout
    source = into / label
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    return source, commit[:10]


def prepare(args: argparse.Namespace, tmp: Path) -> list[Version]:
    """Both versions: unpacked, their databases created and migrated."""
    versions = []
    for label, ref in (("base", args.base), ("head", args.head)):
        source, revision = checkout(ref, label, tmp)
        config = common.database_from_url(args.database_url, f"{args.name}_{label}")
        common.create_database(config)
        version = Version(label, ref, revision, source, config)
        version.run("django", "migrate", "-v", "0")
        versions.append(version)
    return versions


def drain(version: Version, kind: str, tasks: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Fill ``version``'s queue with ``kind`` tasks, drain it with one burst node of that
    version; the figures."""
    topic = TOPIC if kind == "consumer" else TASKS_TOPIC
    version.run(
        "benchmarks.benchapp.drain", "fill" if kind == "consumer" else "fill-tasks", str(tasks)
    )
    env = version.env(settings)
    code, wall, output = run_node(
        env, "--burst", "--topic", topic, "-v", "0", source=version.source
    )
    if code:
        raise RuntimeError(f"{version.label}: runscheduler --burst exited {code}:\n{output}")
    row = json.loads(version.run("benchmarks.benchapp.drain", "read", "--topic", topic))
    if not Path(row["package"]).resolve().is_relative_to(version.source.resolve()):
        raise RuntimeError(f"{version.label} imported {row['package']}, not {version.source}")
    if row["done"] != tasks:
        raise RuntimeError(f"{version.label}: {row['done']} of {tasks} tasks succeeded.\n{output}")
    seconds = (
        datetime.fromisoformat(row["last"]) - datetime.fromisoformat(row["first"])
    ).total_seconds()
    return {
        "rate": round(tasks / seconds),
        "drain_s": round(seconds, 3),
        "wall_s": round(wall, 3),
        "wall_rate": round(tasks / wall),
    }


def run_rounds(args: argparse.Namespace, versions: list[Version]) -> list[dict[str, Any]]:
    """Every round: each settings, both versions, the first one alternating."""
    rounds = []
    for number in range(args.rounds):
        order = versions if number % 2 == 0 else versions[::-1]
        entry: dict[str, Any] = {"round": number + 1, "order": [v.label for v in order]}
        for kind in args.kinds:
            for setting in args.settings:
                name = f"{kind} {setting}"
                entry[name] = {}
                for version in order:
                    figures = drain(version, kind, args.tasks, SETTINGS[kind][setting])
                    entry[name][version.label] = figures
                    print(
                        f"round {number + 1}/{args.rounds} {name:17} {version.label}: "
                        f"{figures['rate']:6} tasks/s (drain {figures['drain_s']:.2f} s, "
                        f"wall {figures['wall_s']:.2f} s)",
                        flush=True,
                    )
                entry[name]["ratio"] = round(
                    entry[name]["head"]["rate"] / entry[name]["base"]["rate"], 3
                )
                entry[name]["wall_ratio"] = round(
                    entry[name]["head"]["wall_rate"] / entry[name]["base"]["wall_rate"], 3
                )
        rounds.append(entry)
    return rounds


def summarize(args: argparse.Namespace, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per settings: each version's median rate, and the head/base ratios' median and range."""
    summary = {}
    for name in (f"{kind} {setting}" for kind in args.kinds for setting in args.settings):
        ratios = [r[name]["ratio"] for r in rounds]
        low, high = min(ratios), max(ratios)
        verdict = (
            "within noise (the ratios straddle 1)"
            if low <= 1 <= high
            else "head faster in every round"
            if low > 1
            else "head slower in every round"
        )
        summary[name] = {
            "base_rate": round(statistics.median(r[name]["base"]["rate"] for r in rounds)),
            "head_rate": round(statistics.median(r[name]["head"]["rate"] for r in rounds)),
            "base_wall_rate": round(
                statistics.median(r[name]["base"]["wall_rate"] for r in rounds)
            ),
            "head_wall_rate": round(
                statistics.median(r[name]["head"]["wall_rate"] for r in rounds)
            ),
            "ratio_median": round(statistics.median(ratios), 3),
            "wall_ratio_median": round(statistics.median(r[name]["wall_ratio"] for r in rounds), 3),
            "ratio_min": low,
            "ratio_max": high,
            "verdict": verdict,
        }
    return summary


def markdown(document: dict[str, Any]) -> str:
    """The report."""
    meta, summary, rounds = document["meta"], document["summary"], document["rounds"]
    base, head = meta["base"], meta["head"]
    lines = [
        "# Throughput, two versions paired in one run",
        "",
        f"{meta['date']}; {meta['machine']}; Python {meta['python']}; {meta['database']}. "
        f"Base: `{base['ref']}` ({base['revision']}); head: `{head['ref']}` ({head['revision']}). "
        f"{meta['tasks']:,} no-op tasks per drain, one `runscheduler --burst` process, "
        f"{meta['rounds']} rounds, the version going first alternating. Load average at start / "
        f"end: {meta['load_start']} / {meta['load_end']}; {meta['duration_min']} min.",
        "",
        "Rate = tasks / (last finish - first start), from the task table; in brackets, tasks / "
        "wall time of the node process (start-up included). Ratio = head / base within a round.",
        "",
        "| tasks, settings | base (tasks/s) | head (tasks/s) | head / base, median | range over rounds | whole process, median | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {s['base_rate']:,} ({s['base_wall_rate']:,}) | {s['head_rate']:,} "
            f"({s['head_wall_rate']:,}) | {s['ratio_median']:.3f} | {s['ratio_min']:.3f}-"
            f"{s['ratio_max']:.3f} | {s.get('wall_ratio_median', '-')} | {s['verdict']} |"
        )
    columns = "".join(f" {n} base | {n} head | {n} ratio |" for n in summary)
    lines += ["", "## Rounds", "", f"| round | order |{columns}"]
    lines += ["| --- | --- |" + " ---: | ---: | ---: |" * len(summary)]
    for r in rounds:
        cells = [
            f"{r[n]['base']['rate']:,} | {r[n]['head']['rate']:,} | {r[n]['ratio']:.3f}"
            for n in summary
        ]
        lines.append(f"| {r['round']} | {'-'.join(r['order'])} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Tasks: `consumer` = the `noop` consumer's tasks, `task` = Django `@task` no-ops "
        f"(`DatabaseBackend`). Settings: tuned = `{json.dumps(TUNED)}` (consumer), "
        f"`{json.dumps(task_bench.TUNED)}` (task), defaults = the package's. Databases: "
        f"`{base['database']}` (base), `{head['database']}` (head), each migrated, filled and "
        "read by its own version. Command: `" + meta["command"] + "`.",
        "",
    ]
    return "\n".join(lines)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git ref of the version before")
    parser.add_argument("--head", default=WORKTREE, help=f"git ref, or {WORKTREE} (default)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "sqlite://",
        help="the server (django-environ syntax; default $DATABASE_URL, else SQLite files)",
    )
    parser.add_argument("--name", default="bench_paired", help="databases NAME_base, NAME_head")
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--settings", default="tuned,defaults", help="tuned, defaults or both")
    parser.add_argument("--kinds", default="consumer", help="consumer, task or both")
    parser.add_argument("--output", default="throughput_paired", help="results/OUTPUT.{json,md}")
    parser.add_argument("--no-write", action="store_true", help="Print, do not store results.")
    args = parser.parse_args()
    args.settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not args.settings or set(args.settings) - {"tuned", "defaults"}:
        parser.error("--settings: choose from tuned, defaults")
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not args.kinds or set(args.kinds) - set(KINDS):
        parser.error(f"--kinds: choose from {', '.join(KINDS)}")
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (medians)")
    return args


def main() -> None:
    args = parse()
    started, load_start = time.monotonic(), common.load_average()
    with tempfile.TemporaryDirectory(prefix="bench_paired_") as tmp:
        versions = prepare(args, Path(tmp))
        rounds = run_rounds(args, versions)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": common.machine(),
        "python": platform.python_version(),
        "database": common.LABELS[common.vendor_of(versions[0].config)],
        "tasks": args.tasks,
        "rounds": args.rounds,
        "command": "python -m benchmarks.paired " + " ".join(sys.argv[1:]),
        "load_start": load_start,
        "load_end": common.load_average(),
        "duration_min": round((time.monotonic() - started) / 60, 1),
        **{
            v.label: {"ref": v.ref, "revision": v.revision, "database": v.config["NAME"]}
            for v in versions
        },
    }
    document = {"meta": meta, "summary": summarize(args, rounds), "rounds": rounds}
    if args.no_write:
        print(markdown(document))
    else:
        common.write_report(args.output, document, lambda: markdown(document))


if __name__ == "__main__":
    main()
