"""Concurrent producers on PostgreSQL: does the wake-up's ``NOTIFY`` serialize their commits?

PostgreSQL takes a global lock before it flushes the commit record of a transaction that
ran ``NOTIFY`` and holds it until the flush is done, so transactions that notify commit one
at a time. An autocommitted ``queue.push`` therefore sends its insert, a ``COMMIT`` and the
wake-up as one query string (``db.with_wake``): the insert commits without the lock, the
wake-up commits in a transaction of its own without waiting for the disk
(``synchronous_commit`` off). This benchmark measures what that buys.

1 and ``--producers`` (8) producer processes, each doing ``--calls`` autocommitted
``queue.push`` calls (single pushes, the real API, topic ``noop``), released together, in
three variants measured in the same round, interleaved (their order rotates per round):

- **ours**: ``queue.push`` as it is: ``INSERT ...; COMMIT; SELECT set_config(
  'synchronous_commit', 'off', true), pg_notify(...)``, one round trip, two transactions.
- **notify in the insert's transaction**: the same call, its query string's tail replaced
  (``db.with_wake`` patched in the producer) by ``INSERT ...; SELECT pg_notify(...)``: one
  round trip, one implicit transaction that notifies and commits with ``synchronous_commit``
  on, as a ``NOTIFY`` inside the writer's transaction (or a CTE calling ``pg_notify``)
  would. Same round trips as ours: only where the ``NOTIFY`` sits differs.
- **no notify**: the same call with no wake-up at all (``db.with_wake`` returns the insert
  alone): the ceiling.

A listener (``LISTEN tasks_coord`` in this process) reads the notifications while the
producers run, as a node would; how many it received is reported per measurement.

The rate of a measurement is all producers' calls / (last producer's end - first
producer's start), start-up and one untimed warm-up push per producer excluded (the
producers wait for a common start signal). Figures are medians of ``--repeat`` rounds; the
scaling ratio (rate with ``--producers`` / rate with 1) and the ratios between variants are
medians of per-round ratios.

Usage::

    ./run bench enqueue_producers
    python -m benchmarks.enqueue_producers --calls 2000 --producers 8 --repeat 3

Results: ``benchmarks/results/enqueue_producers.json`` and
``benchmarks/results/enqueue_producers.md``. PostgreSQL only (database
``bench_producers``); a few minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

from benchmarks.common import (
    bench_env,
    configure_django,
    create_database,
    database,
    git_revision,
    load_average,
    machine,
    postgres_settings,
    tidy,
    write_report,
)

DB_NAME = "bench_producers"
TOPIC = "noop"
OURS = "ours"
IN_TRANSACTION = "notify in the insert's transaction"
NO_NOTIFY = "no notify"
#: Variant name -> the producer's ``--variant`` value.
VARIANTS = {OURS: "ours", IN_TRANSACTION: "in_transaction", NO_NOTIFY: "none"}
PG_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "commit_delay",
    "max_connections",
)


# --- the producer (a subprocess) ------------------------------------------------------------


def patch_variant(variant: str) -> None:
    """Make this producer's pushes send the wake-up of ``variant`` (``ours``: untouched)."""
    from django_tasks_coord import db
    from django_tasks_coord.db.notifications import NOTIFY_CHANNEL, QUEUE_USAGE_LIMIT

    if variant == "in_transaction":

        def in_transaction(sql: str, params: list[Any], topics: Any) -> tuple[str, list[Any]]:
            names = sorted(set(topics))
            calls = ", ".join("pg_notify(%s, %s)" for _ in names)
            notify = f"SELECT {calls} WHERE pg_notification_queue_usage() < {QUEUE_USAGE_LIMIT}"
            return f"{sql}; {notify}", [*params, *(v for n in names for v in (NOTIFY_CHANNEL, n))]

        db.with_wake = in_transaction
    elif variant == "none":
        db.with_wake = lambda sql, params, topics: (sql, list(params))
    elif variant != "ours":
        raise ValueError(f"Unknown variant {variant!r}.")


def produce(variant: str, calls: int, index: int) -> None:
    """One producer: warm up, say ``ready``, wait for ``go`` on stdin, push ``calls`` tasks,
    print the start and end of the timed loop (epoch seconds) as JSON."""
    import django

    django.setup()
    from django_tasks_coord import queue

    patch_variant(variant)
    queue.push(TOPIC, f"warm-{index}", {"i": -1})  # topic look-up and connection: not timed
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    start = time.time()
    for i in range(calls):
        queue.push(TOPIC, f"p{index}-{i}", {"i": i})
    end = time.time()
    print(json.dumps({"start": start, "end": end}), flush=True)


# --- the driver -----------------------------------------------------------------------------


class Listener:
    """``LISTEN tasks_coord`` on a connection of its own; counts what it receives."""

    def __init__(self, config: dict[str, Any]) -> None:
        import psycopg

        self.conn = psycopg.connect(
            host=config["HOST"],
            port=config["PORT"],
            user=config["USER"],
            dbname=config["NAME"],
            autocommit=True,
        )
        self.conn.execute("LISTEN tasks_coord")
        self.received = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stopping.is_set():
            for _ in self.conn.notifies(timeout=0.2):
                self.received += 1

    def take(self) -> int:
        """Notifications received since the last call."""
        time.sleep(0.3)  # the last ones in flight
        count, self.received = self.received, 0
        return count

    def close(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.conn.close()


def reset(alias: str) -> None:
    """Empty the task table (and vacuum it): every measurement starts from the same table."""
    from django_tasks_coord.models import Owner, Task

    Task.objects.using(alias).all().delete()
    Owner.objects.using(alias).all().delete()
    tidy(alias, Task._meta.db_table)


def measure(config: dict[str, Any], variant: str, producers: int, calls: int) -> dict[str, Any]:
    """Start ``producers`` producers of ``variant``, release them together, time them."""
    env = bench_env(config, app="none")
    command = [sys.executable, "-m", "benchmarks.enqueue_producers", "--producer"]
    procs = [
        subprocess.Popen(
            [*command, "--variant", variant, "--calls", str(calls), "--index", str(i)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(producers)
    ]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"A producer failed to start (said {line!r}).")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    spans = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode:
            raise RuntimeError(f"A producer exited with {proc.returncode}.")
        spans.append(json.loads(out.strip().splitlines()[-1]))
    seconds = max(s["end"] for s in spans) - min(s["start"] for s in spans)
    total = producers * calls
    return {
        "producers": producers,
        "calls": total,
        "seconds": seconds,
        "rate": total / seconds,
        "per_producer_seconds": [s["end"] - s["start"] for s in spans],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from django.core.management import call_command

    from django_tasks_coord import queue
    from django_tasks_coord.models import Task

    config = database("postgres", DB_NAME)
    call_command("migrate", database="default", verbosity=0)
    queue.register_topic(TOPIC)
    counts = (1, args.producers)
    samples: list[dict[str, Any]] = []
    listener = Listener(config)
    try:
        for round_ in range(args.repeat):
            names = list(VARIANTS)
            names = names[round_ % len(names) :] + names[: round_ % len(names)]
            for producers in counts:
                for name in names:
                    reset("default")
                    listener.take()
                    sample = measure(config, VARIANTS[name], producers, args.calls)
                    sample.update(
                        round=round_,
                        variant=name,
                        notifications=listener.take(),
                        rows=Task.objects.filter(topic_id=TOPIC).count(),
                        load=load_average(),
                    )
                    samples.append(sample)
                    print(
                        f"round {round_ + 1}, {producers} producer(s), {name}: "
                        f"{sample['rate']:,.0f} calls/s ({sample['notifications']} notifications)",
                        flush=True,
                    )
    finally:
        listener.close()
    reset("default")
    return {"samples": samples, "counts": list(counts)}


def summarize(samples: list[dict[str, Any]], counts: list[int], repeat: int) -> dict[str, Any]:
    """Medians per variant and producer count; per-round ratios' medians."""

    def rate(name: str, producers: int, round_: int) -> float:
        for s in samples:
            if (s["variant"], s["producers"], s["round"]) == (name, producers, round_):
                return float(s["rate"])
        raise KeyError((name, producers, round_))

    low, high = counts
    rounds = range(repeat)
    table: dict[str, Any] = {}
    for name in VARIANTS:
        table[name] = {
            "rate": {str(n): statistics.median(rate(name, n, r) for r in rounds) for n in counts},
            "scaling": statistics.median(rate(name, high, r) / rate(name, low, r) for r in rounds),
        }
    ratios = {
        f"{name} / {NO_NOTIFY}": {
            str(n): statistics.median(rate(name, n, r) / rate(NO_NOTIFY, n, r) for r in rounds)
            for n in counts
        }
        for name in (OURS, IN_TRANSACTION)
    }
    ratios[f"{OURS} / {IN_TRANSACTION}"] = {
        str(n): statistics.median(rate(OURS, n, r) / rate(IN_TRANSACTION, n, r) for r in rounds)
        for n in counts
    }
    return {"table": table, "ratios": ratios}


def markdown(document: dict[str, Any]) -> str:
    low, high = document["counts"]
    summary = document["summary"]
    pg = document["postgres"]
    lines = [
        "# Concurrent producers: the wake-up's NOTIFY and the producers' commits",
        "",
        f"Run {document['date']} on {document['machine']}, commit {document['revision']}.",
        f"PostgreSQL {pg.get('server_version')} (fsync {pg.get('fsync')}, synchronous_commit "
        f"{pg.get('synchronous_commit')}, wal_sync_method {pg.get('wal_sync_method')}, "
        f"commit_delay {pg.get('commit_delay')}), database `{DB_NAME}`.",
        f"Each producer (an OS process) does {document['calls']:,} autocommitted `queue.push` "
        f"calls; {low} and {high} producers, released together. Medians of "
        f"{document['repeat']} rounds, the variants interleaved (order rotated per round); "
        "ratios are medians of per-round ratios. Load average before/after: "
        f"{document['load_before']} / {document['load_after']} (2 cores, shared machine).",
        "",
        f"| variant | {low} producer, calls/s | {high} producers, calls/s | {high}/{low} |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, row in summary["table"].items():
        lines.append(
            f"| {name} | {row['rate'][str(low)]:,.0f} | {row['rate'][str(high)]:,.0f} "
            f"| {row['scaling']:.2f}x |"
        )
    lines += [
        "",
        f"| ratio | {low} producer | {high} producers |",
        "| --- | ---: | ---: |",
    ]
    for name, row in summary["ratios"].items():
        lines.append(f"| {name} | {row[str(low)]:.2f} | {row[str(high)]:.2f} |")
    lines += [
        "",
        "Variants (all through `queue.push`, one round trip per call; only the query "
        "string's tail differs, `db.with_wake` patched in the producers):",
        "",
        "- **ours**: `INSERT ...; COMMIT; SELECT set_config('synchronous_commit', 'off', "
        "true), pg_notify(...)`: the insert commits without the notify lock, the wake-up in a "
        "transaction of its own that does not wait for the disk.",
        "- **notify in the insert's transaction**: `INSERT ...; SELECT pg_notify(...)`: one "
        "implicit transaction that notifies and commits with the flush (what a `NOTIFY` inside "
        "the writer's transaction, or a CTE calling `pg_notify`, does).",
        "- **no notify**: the insert alone (the ceiling).",
        "",
        "## Samples",
        "",
        "| round | producers | variant | calls/s | seconds | notifications received | load |",
        "| ---: | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for s in document["samples"]:
        lines.append(
            f"| {s['round'] + 1} | {s['producers']} | {s['variant']} | {s['rate']:,.0f} "
            f"| {s['seconds']:.2f} | {s['notifications']:,} | {s['load']} |"
        )
    lines += [
        "",
        "Reproduce: `./run bench enqueue_producers` "
        f"(`--calls {document['calls']} --producers {high} --repeat {document['repeat']}`).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="pushes per producer")
    parser.add_argument("--producers", type=int, default=8, help="the concurrent producers")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (medians)")
    parser.add_argument("--producer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.producer:
        produce(args.variant, args.calls, args.index)
        return
    config = database("postgres", DB_NAME)
    try:
        create_database(config)
    except Exception as exc:  # noqa: BLE001 - PostgreSQL only: nothing to measure without it
        print(f"PostgreSQL unreachable: {exc}")
        sys.exit(1)
    configure_django({"default": config})
    load_before = load_average()
    result = run(args)
    document = {
        "benchmark": "enqueue_producers",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "revision": git_revision(),
        "postgres": postgres_settings("default", PG_SETTINGS),
        "calls": args.calls,
        "repeat": args.repeat,
        "load_before": load_before,
        "load_after": load_average(),
        **result,
        "summary": summarize(result["samples"], result["counts"], args.repeat),
    }
    write_report("enqueue_producers", document, lambda: markdown(document))


if __name__ == "__main__":
    main()
