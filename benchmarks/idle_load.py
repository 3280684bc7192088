"""Idle load: the queries per second that idle ``runscheduler`` nodes send to the database.

Measured on each database asked for (``--databases``, PostgreSQL and MariaDB by default),
for each node configuration (:data:`VARIANTS`: the default settings, and the same with a
warm-backup ``--group``, which adds membership heartbeats and leader checks): 1 node, then
8 nodes (``--nodes``), all idle (nothing queued, no job defined), each a real
``runscheduler`` subprocess with the default ``TASKS_COORD`` settings.

- **Statements/s**: every node logs each SQL statement it sends, with the time and the part
  of the node that sent it (``benchapp_idle``: an execute wrapper on each of its
  connections, installed by ``benchmarks.settings`` with ``BENCH_APP=benchapp_idle``; the kind comes from the calling function,
  see ``benchapp_idle/counter.py``). Counted over ``--window`` seconds after a
  ``--warmup`` (start-up excluded), summed over the nodes. ``BEGIN``/``COMMIT`` are not
  statements Django executes through a cursor and are not counted; on PostgreSQL the
  transactions are counted too (below).
- **Transactions/s** (PostgreSQL): ``xact_commit + xact_rollback`` of the benchmark's own
  database in ``pg_stat_database`` over the same window (per database: other databases of
  the shared server do not count). PostgreSQL flushes a busy session's counters at most
  every second and an idle one's within 10 s, so both readings lag a little; over a
  steady window the lags cancel. ``pg_stat_statements`` is not used: it needs
  ``shared_preload_libraries`` (a server restart), and the shared server does not load it.

Each measurement is repeated ``--runs`` times; figures are medians, and the 8-node / 1-node
ratio is taken within each run, then its median reported. The machine is shared: the load
average is recorded with the results.

Usage::

    ./run bench idle_load
    python -m benchmarks.idle_load --databases postgres,mysql --runs 3 --window 30

Results: ``benchmarks/results/idle_load.json`` and ``benchmarks/results/idle_load.md``.
Target: 8 idle nodes send well under 8 times what one sends (PostgreSQL: at most 3 times).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.cluster import Cluster
from benchmarks.common import (
    LABELS,
    SERVERS,
    bench_env,
    configure_django,
    git_revision,
    load_average,
    machine,
    mysql_variables,
    postgres_settings,
    query,
    write_report,
)

DB_NAME = "bench_idle_load"


@dataclasses.dataclass(frozen=True)
class Variant:
    """One node configuration: ``runscheduler`` flags and ``TASKS_COORD`` overrides."""

    name: str
    flags: tuple[str, ...] = ()
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)


VARIANTS = [
    Variant("defaults"),
    Variant("--group (warm backup)", flags=("--group", "bench")),
]


def database(vendor: str) -> dict[str, Any]:
    """The ``DATABASES`` entry of the benchmark database on ``vendor``."""
    return common.database(vendor, DB_NAME)


def prepare(vendor: str) -> None:
    """Migrate; empty the tables the nodes read (no task, no job, no owner, no group); register
    the jobs topic, which every node processes, as a node that ran jobs before would find it."""
    from django.core.management import call_command

    from django_tasks_coord import scheduling, topics
    from django_tasks_coord.models import HealthCheck, Owner, PeriodicTask, Task, TokenHolder

    call_command("migrate", database=vendor, verbosity=0)
    for model in (Task, PeriodicTask, Owner, HealthCheck, TokenHolder):
        model.objects.using(vendor).all().delete()
    with common.on(vendor):
        topics.register_internal_topic(scheduling.JOBS_TOPIC)
    common.tidy(vendor)


def transactions(vendor: str) -> int | None:
    """PostgreSQL: transactions committed or rolled back in the benchmark database so far."""
    if vendor != "postgres":
        return None
    rows = query(
        vendor,
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
        [DB_NAME],
    )
    return int(rows[0][0])


def measure(
    vendor: str, variant: Variant, count: int, warmup: float, window: float
) -> dict[str, Any]:
    """Run ``count`` idle nodes; their statements (and transactions) per second in the window."""
    prepare(vendor)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="idle_load_")))
        cluster = stack.enter_context(Cluster(bench_env(database(vendor), app="benchapp_idle")))
        for i in range(count):
            log = {"BENCH_STATEMENT_LOG": str(tmp / f"node{i}.json")}
            cluster.start("-v", "0", *variant.flags, name=f"node{i}", env=log)
        cluster.wait_ready(vendor, timeout=120)
        time.sleep(warmup)
        load_before = load_average()
        xact_start, start = transactions(vendor), time.time()
        time.sleep(window)
        xact_end, end = transactions(vendor), time.time()
        load_after = load_average()
        alive = all(node.alive for node in cluster.nodes.values())
        codes = cluster.stop(60)
        if not alive or any(codes):
            raise RuntimeError(f"{LABELS[vendor]} nodes exited with {codes}.\n{cluster.output()}")
        kinds: Counter[str] = Counter()
        verbs: Counter[str] = Counter()
        for i in range(count):
            for at, kind, verb in json.loads((tmp / f"node{i}.json").read_text()):
                if start <= at < end:
                    kinds[kind] += 1
                    verbs[verb] += 1
    seconds = end - start
    result: dict[str, Any] = {
        "nodes": count,
        "seconds": round(seconds, 2),
        "statements_per_s": round(sum(kinds.values()) / seconds, 2),
        "by_kind_per_s": {k: round(v / seconds, 3) for k, v in kinds.most_common()},
        "by_verb_per_s": {k: round(v / seconds, 3) for k, v in verbs.most_common()},
        "load_average": [load_before, load_after],
    }
    if xact_start is not None and xact_end is not None:
        # Less this process's own reading (one transaction at the end of the window).
        result["transactions_per_s"] = round((xact_end - xact_start - 1) / seconds, 2)
    return result


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of several runs of one measurement (per kind too)."""
    kinds = sorted({k for r in runs for k in r["by_kind_per_s"]})
    summary: dict[str, Any] = {
        "nodes": runs[0]["nodes"],
        "statements_per_s": round(statistics.median(r["statements_per_s"] for r in runs), 2),
        "runs_statements_per_s": [r["statements_per_s"] for r in runs],
        "by_kind_per_s": {
            k: round(statistics.median(r["by_kind_per_s"].get(k, 0.0) for r in runs), 3)
            for k in kinds
        },
    }
    if all("transactions_per_s" in r for r in runs):
        summary["transactions_per_s"] = round(
            statistics.median(r["transactions_per_s"] for r in runs), 2
        )
    return summary


def run_variant(
    vendor: str, variant: Variant, counts: list[int], runs: int, warmup: float, window: float
) -> dict[str, Any]:
    """Every node count of one variant, ``runs`` times (counts alternate within a run)."""
    per_count: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    ratios: list[float] = []
    for i in range(runs):
        round_ = {}
        for n in counts:
            print(
                f"  {LABELS[vendor]}, {variant.name}: {n} node(s), run {i + 1}/{runs}...",
                flush=True,
            )
            round_[n] = measure(vendor, variant, n, warmup, window)
            per_count[n].append(round_[n])
            print(f"    {round_[n]['statements_per_s']} statements/s", flush=True)
        low, high = min(counts), max(counts)
        if round_[low]["statements_per_s"]:
            ratios.append(round_[high]["statements_per_s"] / round_[low]["statements_per_s"])
    return {
        "variant": variant.name,
        "flags": list(variant.flags),
        "settings": variant.settings,
        "by_nodes": {str(n): median_run(r) for n, r in per_count.items()},
        "ratio": round(statistics.median(ratios), 2) if ratios else None,
        "ratios": [round(r, 2) for r in ratios],
        "runs": {str(n): r for n, r in per_count.items()},
    }


# --- report ---------------------------------------------------------------------------------


def markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    """The results as Markdown."""
    counts = meta["nodes"]
    low, high = min(counts), max(counts)
    lines = [
        "# Idle load benchmark",
        "",
        f"{meta['date']}; {meta['machine']}; Python {meta['python']}, Django {meta['django']}; "
        f"commit {meta['commit']}. Servers: "
        + "; ".join(f"{LABELS[v]} {json.dumps(s)}" for v, s in meta["servers"].items())
        + ".",
        "",
        f"Load average (1/5/15 min) at start {meta['load_at_start']}, at end "
        f"{meta['load_at_end']} (each measurement's own, before and after its window, is in "
        "the JSON). The machine is shared.",
        "",
        f"Idle `runscheduler` nodes (nothing queued, no job defined, default settings unless "
        f"the variant says otherwise): {' and '.join(map(str, counts))} at once. Statements "
        "sent by all the nodes together, counted by an execute wrapper in each node "
        f"(`BEGIN`/`COMMIT` not included) over {meta['window']} s after a {meta['warmup']} s "
        f"warm-up; medians of {meta['runs']} runs. *Ratio*: {high} nodes / {low} node, within "
        "each run, median. PostgreSQL also: transactions/s of the benchmark database "
        "(`pg_stat_database`).",
        "",
        f"| database | variant | {low} node: statements/s | {high} nodes: statements/s | "
        f"ratio | {low} node: transactions/s | {high} nodes: transactions/s | runs ({high} nodes) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for vendor, variants in results["measurements"].items():
        for v in variants:
            a, b = v["by_nodes"][str(low)], v["by_nodes"][str(high)]
            lines.append(
                f"| {LABELS[vendor]} | {v['variant']} | {a['statements_per_s']} | "
                f"{b['statements_per_s']} | {v['ratio']} | {a.get('transactions_per_s', '-')} | "
                f"{b.get('transactions_per_s', '-')} | "
                f"{', '.join(map(str, b['runs_statements_per_s']))} |"
            )
    for vendor, variants in results["measurements"].items():
        for v in variants:
            a, b = v["by_nodes"][str(low)], v["by_nodes"][str(high)]
            kinds = sorted(
                set(a["by_kind_per_s"]) | set(b["by_kind_per_s"]),
                key=lambda k: -b["by_kind_per_s"].get(k, 0.0),
            )
            lines += [
                "",
                f"### {LABELS[vendor]}, {v['variant']}: statements/s by kind",
                "",
                f"| kind | {low} node | {high} nodes | per node ({high} nodes) |",
                "| --- | ---: | ---: | ---: |",
            ]
            for k in kinds:
                x, y = a["by_kind_per_s"].get(k, 0.0), b["by_kind_per_s"].get(k, 0.0)
                lines.append(f"| {k} | {x} | {y} | {round(y / high, 3)} |")
    if results.get("errors"):
        lines += ["", "## Failed measurements", ""]
        lines += [f"- {e.splitlines()[0]}" for e in results["errors"]]
    return "\n".join(lines) + "\n"


def server_info(vendors: list[str]) -> dict[str, Any]:
    """Server versions."""
    info: dict[str, Any] = {}
    if "postgres" in vendors:
        info["postgres"] = postgres_settings("postgres", ["server_version"])
    if "mysql" in vendors:
        info["mysql"] = {"version": mysql_variables("mysql").get("version")}
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="postgres,mysql")
    parser.add_argument("--nodes", default="1,8", help="node counts, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--variants", default="", help="variant numbers (0-based); all if empty")
    parser.add_argument("--name", default="idle_load", help="results file name")
    args = parser.parse_args()
    vendors = [v for v in args.databases.split(",") if v]
    unknown = set(vendors) - set(SERVERS) or {"sqlite"} & set(vendors)
    if unknown:
        parser.error(f"unsupported database(s): {', '.join(sorted(unknown))}")
    vendors = [v for v in vendors if common.reachable(v, DB_NAME)]
    if not vendors:
        sys.exit("No database answers.")
    databases = {vendor: database(vendor) for vendor in vendors}
    configure_django({"default": databases[vendors[0]], **databases})
    import django

    counts = [int(n) for n in args.nodes.split(",")]
    chosen = [VARIANTS[int(i)] for i in args.variants.split(",") if i] or VARIANTS
    load_at_start = load_average(" / ")
    results: dict[str, Any] = {"measurements": {}, "errors": []}
    for vendor in vendors:
        for variant in chosen:
            try:
                results["measurements"].setdefault(vendor, []).append(
                    run_variant(vendor, variant, counts, args.runs, args.warmup, args.window)
                )
            except Exception as exc:  # noqa: BLE001 - one failed measurement must not end the run
                results["errors"].append(f"{vendor} {variant.name}: {str(exc)[-3000:]}")
                print(f"  FAILED {vendor} {variant.name}: {str(exc)[-3000:]}", flush=True)
        prepare(vendor)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "commit": git_revision(),
        "servers": server_info(vendors),
        "nodes": counts,
        "runs": args.runs,
        "warmup": args.warmup,
        "window": args.window,
        "load_at_start": load_at_start,
        "load_at_end": load_average(" / "),
    }
    write_report(args.name, {"meta": meta, **results}, lambda: markdown(results, meta))


if __name__ == "__main__":
    main()
