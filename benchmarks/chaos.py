"""Chaos run for warm backup: random SIGKILL / SIGSTOP / SIGTERM of the token holder.

Three ``runscheduler --group chaos`` nodes share one database. A leader-only job
fires every ``--interval`` seconds (``scheduling.schedule_recurring(..., leader_only=True)``);
each run sleeps 50-200 ms (simulated work), then records itself (job id, slot, term, node,
start and end) inside ``ctx.fenced()``, the run's commit point (``chaosapp/work.py``).

``--events`` times (default 50), once the group is stable (every node a member, a leader
that has recorded a run under its term), the script picks a signal with a seeded random
generator and sends it to the holder it reads with ``coordination.leader(group)``:

- **SIGKILL**: the node dies at once; a standby must take over once the holder's heartbeat
  is older than the liveness interval.
- **SIGSTOP** for longer than the liveness interval, then **SIGCONT**: a standby takes
  over meanwhile; the woken node must find its owner row gone, register again as a fresh
  node (it does not exit), and later stop cleanly (exit 0) on SIGTERM.
- **SIGTERM**: a graceful stop; the holder releases the token and a standby takes it.

Right after each takeover the script snapshots ``token_holder`` (term, holder,
``acquired_at``, ``released_at``) and the deposed holder's ``health_check.last_heartbeat``
(later events overwrite them), then replaces the signalled node with a fresh one (a new
node id), so three nodes stay alive. Gaps without a leader are measured on the **database
clock**: for SIGKILL and SIGSTOP from the deposed holder's last heartbeat to the new
holder's ``acquired_at`` (bound: liveness interval + one heartbeat); for SIGTERM from
``released_at`` to ``acquired_at`` (bound: two heartbeats).

At the end, over every recorded run: runs whose [start, end] intervals overlap, slots
recorded twice, runs recorded under a term lower than one recorded before they started,
and runs by a node that did not hold their term must all be zero. Terms and runs per term
are counted too.

Usage::

    ./run bench chaos
    python -m benchmarks.chaos [--database postgres|mysql] [--events 50] [--seed 1]

Other options: ``--heartbeat 0.2``, ``--liveness 2.0``, ``--interval 0.5`` (node and job
timings), ``--name bench_chaos`` (the database), ``--no-write``; two variants that aim at
lock windows: ``--work-in-fence`` (the job's work inside ``ctx.fenced()``) and
``--stop-in-lock`` (each SIGSTOP lands while the holder holds the ``token_holder`` row
lock: found through ``pg_stat_activity`` on PostgreSQL, by trial elsewhere, confirmed by a
NOWAIT probe). The exit status is 1 when an invariant or a bound was broken.

Results: ``benchmarks/results/chaos.json`` (every event and figure, one entry per database
and variant; the other entries are kept) and ``benchmarks/results/chaos.md``. Each node's
log is kept in a temporary directory named in the results. A run takes 3-6 minutes.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import itertools
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.cluster import Cluster, Node
from benchmarks.common import RESULTS, bench_env, create_database, git, load_average

GROUP = "chaos"
JOB_ID = "chaos-leader"
JOB = "benchmarks.chaosapp.work.leader_run"
NODES = 3
KILL, STOP, TERM = "SIGKILL", "SIGSTOP", "SIGTERM"
KINDS = (KILL, STOP, TERM)
#: The line every node logs when it becomes the leader (node id, term).
LEADS = re.compile(rf"Node (\S+) leads group '{GROUP}' \(term (\d+)\)")

#: The servers a chaos run can use (several processes share the database: no SQLite).
SERVERS = {vendor: common.SERVERS[vendor] for vendor in ("postgres", "mysql")}
LABELS = {vendor: common.LABELS[vendor] for vendor in SERVERS}


# --- set-up ---------------------------------------------------------------------------------


def node_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``TASKS_COORD`` settings of every node (and of this process): short intervals."""
    return {
        "HEARTBEAT_FREQUENCY": args.heartbeat,
        "LIVENESS_INTERVAL": args.liveness,
        "POLL_INTERVAL": 0.1,
        "REAP_INTERVAL": 0.3,
        "STATUS_INTERVAL": 0,
        "SHUTDOWN_MAX_WAIT": 2,
        "WORKERS": 2,
        "BUFFER": 2,
    }


def environment(config: dict[str, Any], settings: dict[str, Any]) -> dict[str, str]:
    """The environment of this process's Django and of every node it starts."""
    return bench_env(config, app="chaosapp", tasks_coord=settings)


def setup_django(env: dict[str, str]) -> None:
    """Configure Django here, migrate the chaos database and empty every table."""
    keys = ("DJANGO_SETTINGS_MODULE", "BENCH_DATABASE", "BENCH_APP", "BENCH_TASKS_COORD")
    os.environ.update({k: env[k] for k in keys})
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)


def db_now() -> datetime:
    """The database clock, now (not the transaction's start)."""
    from django.db import connection

    sql = "SELECT clock_timestamp()" if connection.vendor == "postgresql" else "SELECT NOW(6)"
    with connection.cursor() as cursor:
        cursor.execute(sql)
        value = cursor.fetchone()[0]
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# --- nodes ----------------------------------------------------------------------------------


class Group(Cluster):
    """The group's nodes (``n1``, ``n2``...): started, replaced and stopped by the script.

    Each node is ``runscheduler --group chaos --node-id nN -v 1``, in a session of its own (a
    Ctrl-C of the script is not theirs: it reaps them), its log kept in ``logs``.
    """

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        super().__init__(env, logs=logs, new_session=True)
        self._ids = 0

    def add(self) -> Node:
        self._ids += 1
        node_id = f"n{self._ids}"
        args = ("--group", GROUP, "--node-id", node_id, "-v", "1")
        return self.start(*args, name=node_id, env={"BENCH_NODE": node_id})


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.01) -> Any:
    """Poll ``predicate`` until it returns something truthy; None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)  # polling a condition with a deadline


def members_fresh(cluster: Group, liveness: float) -> bool:
    """Every live node is a member with a fresh heartbeat (half a liveness) and an owner row."""
    from django_tasks_coord import db
    from django_tasks_coord.models import HealthCheck, Owner

    live = {node.name for node in cluster.live()}
    if len(live) < NODES:
        return False
    fresh = HealthCheck.objects.filter(
        group_id=GROUP,
        task_id__in=live,
        last_heartbeat__gte=db.ago(timedelta(seconds=liveness / 2)),
    )
    return fresh.count() == len(live) and Owner.objects.filter(name__in=live).count() == len(live)


def stable(cluster: Group, liveness: float) -> Any:
    """The leader once the group is stable: every member fresh, a run recorded under its term."""
    from benchmarks.chaosapp.models import LeaderRun
    from django_tasks_coord import coordination

    leader = coordination.leader(GROUP)
    if leader is None or leader.node_id not in cluster.nodes:
        return None
    if not cluster.nodes[leader.node_id].alive or not members_fresh(cluster, liveness):
        return None
    if not LeaderRun.objects.filter(term=leader.term, node=leader.node_id).exists():
        return None
    return leader


def evidence(cluster: Group) -> dict[str, Any]:
    """What the database and the nodes looked like when something went wrong."""
    from django.db import connection

    from django_tasks_coord.models import HealthCheck, Owner, TokenHolder

    found: dict[str, Any] = {
        "token_holder": [_row(r) for r in TokenHolder.objects.values()],
        "health_check": [_row(r) for r in HealthCheck.objects.values()],
        "owners": [_row(r) for r in Owner.objects.values("name", "pid", "heartbeat")],
        "db_now": db_now().isoformat(),
    }
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT application_name, pid, state, xact_start, state_change, wait_event_type, "
                "left(query, 300) "
                "FROM pg_stat_activity WHERE datname = current_database() AND state <> 'idle' "
                "AND pid <> pg_backend_pid()"
            )
        else:
            cursor.execute(
                "SELECT trx_mysql_thread_id, trx_state, trx_started, left(trx_query, 300) "
                "FROM information_schema.innodb_trx"
            )
        found["transactions"] = [[str(v) for v in row] for row in cursor.fetchall()]
    found["logs"] = {node.name: node.tail(30) for node in cluster.nodes.values()}
    return found


def _row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


# --- events ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Event:
    """One signal sent to the holder and what followed (times: database clock)."""

    index: int
    kind: str
    holder: str
    term: int
    signalled_at: datetime
    new_holder: str | None = None
    new_term: int | None = None
    last_heartbeat: datetime | None = None  # the deposed holder's (SIGKILL, SIGSTOP)
    released_at: datetime | None = None  # SIGTERM
    acquired_at: datetime | None = None
    gap: float | None = None  # seconds without a leader
    gap_at_least: float | None = None  # no takeover while stopped: last heartbeat -> SIGCONT
    bound: float = 0.0
    takeover_after: float | None = None  # signal -> acquired_at
    stopped_for: float | None = None  # SIGSTOP: seconds between SIGSTOP and SIGCONT
    owner_expired: bool | None = None  # SIGSTOP: its owner row was gone before SIGCONT
    in_lock: bool | None = None  # --stop-in-lock: stopped holding the token_holder row lock
    lock_attempts: int | None = None  # --stop-in-lock: SIGSTOPs it took to catch it there
    exit_code: int | None = None
    exit_after: float | None = None  # SIGSTOP: SIGCONT -> exit; SIGTERM: takeover seen -> exit
    exit_after_signal: float | None = None  # SIGTERM: the signal -> exit
    anomalies: list[str] = dataclasses.field(default_factory=list)
    evidence: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return _row(dataclasses.asdict(self))


def kinds_for(events: int, rng: random.Random) -> list[str]:
    """``events`` signals, each kind a third of them (the rest drawn), in a seeded random order."""
    kinds = [kind for kind in KINDS for _ in range(events // len(KINDS))]
    kinds += rng.sample(KINDS, events % len(KINDS))
    rng.shuffle(kinds)
    return kinds


def strike(
    cluster: Group, index: int, kind: str, leader: Any, rng: random.Random, args: Any
) -> Event:
    """Send ``kind`` to the holder, snapshot the takeover, let the node end, replace it."""
    from django_tasks_coord.models import Owner

    node = cluster.nodes[leader.node_id]
    node.signalled = True
    event = Event(index, kind, leader.node_id, leader.term, signalled_at=db_now())
    event.bound = 2 * args.heartbeat if kind == TERM else args.liveness + args.heartbeat
    started = time.monotonic()
    if kind == KILL:
        node.proc.kill()
    elif kind == STOP and args.stop_in_lock:
        event.lock_attempts = stop_in_lock(node)
        event.in_lock = event.lock_attempts is not None
        event.signalled_at, started = db_now(), time.monotonic()
    elif kind == STOP:
        os.kill(node.proc.pid, signal.SIGSTOP)
        node.stopped = True
    else:
        node.proc.send_signal(signal.SIGTERM)

    patience = args.liveness + 15
    if not takeover(event, args, patience):
        event.anomalies.append(f"no takeover within {patience}s of the signal")
        event.evidence = evidence(cluster)
    if kind == KILL:
        node.proc.wait()
        event.exit_code = node.proc.returncode
    else:
        if kind == STOP:
            hold = args.liveness + rng.uniform(0.5, 1.5)
            time.sleep(max(hold - (time.monotonic() - started), 0.0))
            gone = lambda: not Owner.objects.filter(name=leader.node_id).exists()  # noqa: E731
            event.owner_expired = bool(wait_for(gone, timeout=args.liveness + 3))
            if event.new_term is None:  # the holder's last heartbeat, before it wakes up
                event.last_heartbeat = last_heartbeat(leader.node_id)
                if event.last_heartbeat is not None:
                    waited = db_now() - event.last_heartbeat
                    event.gap_at_least = round(waited.total_seconds(), 3)
            event.stopped_for = round(time.monotonic() - started, 3)
            os.kill(node.proc.pid, signal.SIGCONT)
            node.stopped = False
            if event.new_term is None and takeover(event, args, 15, event.last_heartbeat):
                event.anomalies.append(f"taken over only after SIGCONT, gap {event.gap}s")
        woken = time.monotonic()
        if kind == STOP:
            rejoined = lambda: "registered again" in node.output(20000)  # noqa: E731
            if not wait_for(rejoined, timeout=20):
                event.anomalies.append("the woken node did not register again within 20s")
                event.evidence = event.evidence or {"log": node.tail(60)}
            elif node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)  # it goes on as a fresh node: stop it
        try:
            node.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            event.anomalies.append("the node did not exit within 20s")
            event.evidence = event.evidence or evidence(cluster)
            node.destroy()
        else:
            event.exit_after = round(time.monotonic() - woken, 3)
            if kind == TERM:
                event.exit_after_signal = round(time.monotonic() - started, 3)
        event.exit_code = node.proc.returncode
        expected = 0  # SIGTERM; a SIGSTOPped node registers again and is then stopped
        if event.exit_code != expected:
            event.anomalies.append(f"exit code {event.exit_code}, expected {expected}")
            event.evidence = event.evidence or {"log": node.tail(60)}
    cluster.add()
    return event


def token_lock(node_id: str) -> tuple[Any, ...] | None:
    """The backend of ``node_id`` while it holds the ``token_holder`` row lock (PostgreSQL).

    Its connection (``application_name`` = node id) is idle in a transaction whose last
    statement was a ``SELECT ... FROM token_holder ... FOR UPDATE``: the lock is held
    until that transaction ends. Returns (pid, state_change), or None.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, state_change FROM pg_stat_activity WHERE application_name = %s "
            "AND state = 'idle in transaction' AND query LIKE %s",
            [node_id, '%FROM "token_holder"%FOR UPDATE%'],
        )
        return cursor.fetchone()


def token_locked() -> bool:
    """Whether a transaction holds the ``token_holder`` row lock right now (a NOWAIT probe)."""
    from django.db import OperationalError, transaction

    from django_tasks_coord.models import TokenHolder

    try:
        with transaction.atomic():
            list(TokenHolder.objects.select_for_update(nowait=True).filter(group_id=GROUP))
    except OperationalError:
        return True
    return False


def stop_in_lock(node: Node, timeout: float = 60.0) -> int | None:
    """SIGSTOP ``node`` while it holds the ``token_holder`` row lock; the attempts it took.

    The lock is held for a millisecond or so per heartbeat. On PostgreSQL the moment is
    read from ``pg_stat_activity``; elsewhere the node is stopped at random moments.
    Once it is stopped, the row must still be locked (a NOWAIT probe, twice 0.1 s apart:
    a standby's check holds it for a millisecond only); if not, the node is continued
    at once (stopped for a few milliseconds) and the script tries again. None: never
    caught (the node is stopped anyway).
    """
    from django.db import connection

    postgres = connection.vendor == "postgresql"
    attempts, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        if postgres and token_lock(node.name) is None:
            continue
        if not postgres:
            time.sleep(random.uniform(0.0, 0.02))  # a random moment of its heartbeat
        os.kill(node.proc.pid, signal.SIGSTOP)
        attempts += 1
        if token_locked():
            time.sleep(0.1)
            if token_locked():
                node.stopped = True
                return attempts
        os.kill(node.proc.pid, signal.SIGCONT)
    os.kill(node.proc.pid, signal.SIGSTOP)
    node.stopped = True
    return None


def last_heartbeat(node_id: str) -> datetime | None:
    from django_tasks_coord.models import HealthCheck

    beat = HealthCheck.objects.filter(group_id=GROUP, task_id=node_id)
    return beat.values_list("last_heartbeat", flat=True).first()


def takeover(event: Event, args: Any, timeout: float, heartbeat: datetime | None = None) -> bool:
    """Wait for a new term, then snapshot ``token_holder`` and the deposed holder's heartbeat.

    Right away: the next event overwrites these columns (and a woken holder its heartbeat).
    """
    from django_tasks_coord.models import TokenHolder

    taken = TokenHolder.objects.filter(group_id=GROUP, term__gt=event.term).exclude(task_id="")
    row = wait_for(lambda: taken.values().first(), timeout=timeout)
    if row is None:
        return False
    event.last_heartbeat = heartbeat or last_heartbeat(event.holder)
    event.new_holder, event.new_term = row["task_id"], row["term"]
    event.acquired_at, event.released_at = row["acquired_at"], row["released_at"]
    event.takeover_after = (row["acquired_at"] - event.signalled_at).total_seconds()
    since = event.released_at if event.kind == TERM else event.last_heartbeat
    if event.kind == TERM and (since is None or since < event.signalled_at):
        event.anomalies.append("taken over without a release by the stopping holder")
        since = event.last_heartbeat
    if since is not None:
        event.gap = (row["acquired_at"] - since).total_seconds()
    if event.gap is None or event.gap > event.bound:
        event.anomalies.append(f"gap {event.gap}s beyond the bound {event.bound:.2f}s")
    if event.gap is not None and event.kind != TERM and event.gap < args.liveness:
        event.anomalies.append(f"taken over {event.gap}s after the last heartbeat: too early")
    if event.new_term != event.term + 1:
        event.anomalies.append(f"term moved from {event.term} to {event.new_term}")
    if event.new_holder == event.holder:
        event.anomalies.append("the signalled holder holds the token again")
    return True


def settle(cluster: Group, args: Any, event: Event | None) -> Any:
    """Wait until the group is stable again; replace (and report) nodes that died by themselves."""

    def check() -> Any:
        for node in cluster.casualties():
            print(f"  node {node.name} exited by itself (code {node.proc.returncode})")
            if event is not None:
                event.anomalies.append(
                    f"node {node.name} exited by itself with code {node.proc.returncode}"
                )
                event.evidence = event.evidence or {}
                event.evidence.setdefault("casualties", {})[node.name] = node.tail(60)
            cluster.add()
        return stable(cluster, args.liveness)

    return wait_for(check, timeout=90, interval=0.05)


def chaos(cluster: Group, args: Any) -> tuple[list[Event], dict[str, Any]]:
    """Start the group, schedule the job, strike ``args.events`` times; the events and facts."""
    from django_tasks_coord import coordination, scheduling

    rng = random.Random(args.seed)
    for _ in range(NODES):
        cluster.add()
    wait_for(lambda: coordination.leader(GROUP), timeout=90, interval=0.1)
    scheduling.schedule_recurring(
        JOB,
        args.interval,
        group=GROUP,
        leader_only=True,
        job_id=JOB_ID,
        kwargs={"work_min": 0.05, "work_max": 0.2, "in_fence": args.work_in_fence},
    )
    first = settle(cluster, args, None)
    if first is None:
        raise RuntimeError(f"the group never became stable: {json.dumps(evidence(cluster))}")
    facts: dict[str, Any] = {"first_leader": first.node_id, "first_term": first.term}
    began = time.monotonic()
    events: list[Event] = []
    leader = first
    for index, kind in enumerate(kinds_for(args.events, rng), 1):
        time.sleep(rng.uniform(0.3, 2.0))  # a random moment of the job's cycle
        leader = coordination.leader(GROUP) or leader
        event = strike(cluster, index, kind, leader, rng, args)
        events.append(event)
        print(
            f"  {index:3} {kind:8} {event.holder:>4} t{event.term:<3} -> "
            f"{event.new_holder or '-':>4} t{event.new_term or '-':<3} "
            f"gap {event.gap if event.gap is None else f'{event.gap:6.3f}s'} "
            f"(bound {event.bound:.2f}s) exit {event.exit_code}"
            + (
                f" [stopped holding the token row, try {event.lock_attempts}]"
                if event.in_lock
                else ""
            )
            + (f"  ANOMALY: {'; '.join(event.anomalies)}" if event.anomalies else ""),
            flush=True,
        )
        leader = settle(cluster, args, event)
        if leader is None:
            event.anomalies.append("the group did not become stable again within 90s")
            event.evidence = event.evidence or evidence(cluster)
            print("  the group did not become stable again: stopping the run", flush=True)
            break
    facts["chaos_s"] = round(time.monotonic() - began, 1)
    final = coordination.leader(GROUP)
    facts["last_term"] = final.term if final else None
    return events, facts


# --- analysis -------------------------------------------------------------------------------


def summarize(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def analyze(events: list[Event], facts: dict[str, Any], args: Any, logs: Path) -> dict[str, Any]:
    """Every figure of the run, from the events and the recorded runs."""
    from benchmarks.chaosapp.models import LeaderRun

    runs = list(
        LeaderRun.objects.values(
            "id", "slot", "term", "node", "started", "ended", "recorded_at", "attempt"
        )
    )
    by_start = sorted(runs, key=lambda r: (r["started"], r["id"]))

    # Overlaps: a run starting before an earlier-starting run ended.
    overlaps, latest = [], None
    for run in by_start:
        if latest is not None and run["started"] < latest["ended"]:
            overlaps.append([_row(latest), _row(run)])
        if latest is None or run["ended"] > latest["ended"]:
            latest = run

    # A run recorded under a lower term than one recorded (ended) before it started.
    by_end = sorted(runs, key=lambda r: r["ended"])
    ends = [r["ended"] for r in by_end]
    highest: list[int] = []
    for run in by_end:
        highest.append(max(run["term"] or 0, highest[-1] if highest else 0))
    regressions = []
    for run in by_start:
        before = bisect.bisect_left(ends, run["started"])
        if before and highest[before - 1] > (run["term"] or 0):
            regressions.append({**_row(run), "higher_term_before": highest[before - 1]})
    # The same on the database clock: terms in commit (insert) order never go down.
    by_db = sorted(runs, key=lambda r: (r["recorded_at"], r["id"]))
    db_order = sum(1 for a, b in itertools.pairwise(by_db) if b["term"] < a["term"])

    slots = Counter(r["slot"] for r in runs)
    twice = {slot.isoformat(): n for slot, n in slots.items() if n > 1}

    # Who led under each term: every node logs "Node X leads group 'chaos' (term T)".
    leaders: dict[int, set[str]] = {}
    for log in logs.glob("*.log"):
        for node, term in LEADS.findall(log.read_text(errors="replace")):
            leaders.setdefault(int(term), set()).add(node)
    leaders.setdefault(facts["first_term"], set()).add(facts["first_leader"])
    for e in events:
        if e.new_term is not None:
            leaders.setdefault(e.new_term, set()).add(e.new_holder or "")
    shared_terms = {t: sorted(nodes) for t, nodes in leaders.items() if len(nodes) > 1}
    not_holder = [_row(r) for r in runs if r["node"] not in leaders.get(r["term"], set())]

    per_term = Counter(r["term"] for r in runs)
    last = facts["last_term"] or facts["first_term"]
    chaos_terms = range(facts["first_term"], last + 1)
    by_events = {facts["first_term"]} | {e.new_term for e in events if e.new_term is not None}
    term_steps = Counter((e.new_term - e.term) if e.new_term is not None else None for e in events)

    gaps: dict[str, Any] = {}
    for kind in KINDS:
        mine = [e for e in events if e.kind == kind]
        values = [e.gap for e in mine if e.gap is not None]
        bound = 2 * args.heartbeat if kind == TERM else args.liveness + args.heartbeat
        over = [v for v in values if v > bound]
        gaps[kind] = {
            **summarize(values),
            "bound": round(bound, 3),
            "over_bound": len(over) + sum(1 for e in mine if e.gap is None),
            "no_takeover_while_stopped": [e.gap_at_least for e in mine if e.gap_at_least],
            "worst_excess": round(max(over) - bound, 3) if over else 0.0,
            "takeover_after_signal": summarize(
                [e.takeover_after for e in mine if e.takeover_after is not None]
            ),
            "exit_codes": dict(Counter(str(e.exit_code) for e in mine)),
            "exit_after": summarize([e.exit_after for e in mine if e.exit_after is not None]),
            "exit_after_signal": summarize(
                [e.exit_after_signal for e in mine if e.exit_after_signal is not None]
            ),
        }
    stops = [e for e in events if e.kind == STOP]
    refused = sum(
        log.read_text(errors="replace").count("Not completing") for log in logs.glob("*.log")
    )
    starts = [r["started"] for r in by_start]
    pauses = [b - a for a, b in itertools.pairwise(starts)]
    return {
        "events": len(events),
        "events_by_kind": dict(Counter(e.kind for e in events)),
        "gaps": gaps,
        "runs": len(runs),
        "overlapping_runs": len(overlaps),
        "double_slots": len(twice),
        "term_regressions": len(regressions),
        "term_order_violations_db_clock": db_order,
        "runs_by_non_holder": len(not_holder),
        "terms_led_by_two_nodes": len(shared_terms),
        "terms": {
            "first": facts["first_term"],
            "last": facts["last_term"],
            "count": len(chaos_terms),
            "term_steps": {str(k): v for k, v in term_steps.items()},
            "not_from_an_event": [t for t in chaos_terms if t not in by_events],
            "after_the_events": sorted(t for t in leaders if t > last),
            "with_runs": sum(1 for t in chaos_terms if per_term[t]),
            "without_runs": sorted(t for t in chaos_terms if not per_term[t]),
            "runs_per_term": summarize([per_term[t] for t in chaos_terms]),
        },
        "stopped_nodes": {
            "owner_expired_before_sigcont": sum(1 for e in stops if e.owner_expired),
            "stopped_for": summarize([e.stopped_for for e in stops if e.stopped_for]),
        },
        "completions_refused_to_deposed_leaders": refused,
        "seconds_between_run_starts": summarize(pauses),
        "anomalies": sum(1 for e in events if e.anomalies),
        "examples": {
            "overlaps": overlaps[:10],
            "double_slots": dict(list(twice.items())[:10]),
            "term_regressions": regressions[:10],
            "runs_by_non_holder": not_holder[:10],
            "terms_led_by_two_nodes": dict(list(shared_terms.items())[:10]),
        },
    }


# --- results --------------------------------------------------------------------------------


def write_results(vendor: str, entry: dict[str, Any]) -> None:
    """Store this database's entry in ``chaos.json`` (keeping the others) and rewrite ``chaos.md``."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "chaos.json"
    stored: dict[str, Any] = {"databases": {}}
    if path.exists():
        stored = json.loads(path.read_text())
    stored.setdefault("databases", {})[vendor] = entry
    path.write_text(json.dumps(stored, indent=2, default=str) + "\n")
    (RESULTS / "chaos.md").write_text(markdown(stored["databases"]))


def markdown(databases: dict[str, Any]) -> str:
    lines = [
        "# Chaos run: warm backup under random SIGKILL / SIGSTOP / SIGTERM of the holder",
        "",
        "Written by `benchmarks/chaos.py` (see its docstring for the method). Three",
        "`runscheduler --group chaos` nodes; a leader-only job records each run inside",
        "`ctx.fenced()`; the holder read with `coordination.leader()` gets a seeded random",
        "signal once the group is stable, and the signalled node is replaced by a fresh one.",
        "Gaps without a leader are on the database clock: SIGKILL/SIGSTOP from the deposed",
        "holder's last heartbeat to the new holder's `acquired_at`, SIGTERM from `released_at`",
        "to `acquired_at`. Sections named only by their database are the latest plain runs;",
        "the others are earlier revisions or variants (`--stop-in-lock`, `--work-in-fence`).",
    ]
    order = sorted(databases, key=lambda key: "(" in key)  # plain runs first, stable otherwise
    for vendor, entry in ((key, databases[key]) for key in order):
        meta, s = entry["meta"], entry["summary"]
        t = s["terms"]
        lines += [
            "",
            f"## {LABELS.get(vendor.split()[0], vendor)}{vendor[len(vendor.split()[0]) :]}",
            "",
            f"{meta['date']}, revision {meta.get('revision', '?')}, {meta['database']}, seed {meta['seed']}, {s['events']} events in "
            f"{meta['chaos_min']} min (whole run {meta['duration_min']} min), load "
            f"{meta['load_start']} -> {meta['load_end']} on {meta['cpus']} CPUs"
            + (
                " (other benchmarks were running)"
                if meta.get("other_benchmarks_at_start") or meta.get("other_benchmarks_at_end")
                else " (no other benchmark running at start or end)"
            )
            + ". Nodes: "
            f"heartbeat {meta['settings']['HEARTBEAT_FREQUENCY']}s, liveness "
            f"{meta['settings']['LIVENESS_INTERVAL']}s, poll {meta['settings']['POLL_INTERVAL']}s, "
            f"reap {meta['settings']['REAP_INTERVAL']}s; job every {meta['interval']}s "
            + (
                "(50-200 ms of work inside the fenced block)."
                if meta.get("work_in_fence")
                else "(50-200 ms of work, then the fenced record)."
            )
            + (
                " Each SIGSTOP sent while the holder held the `token_holder` row lock "
                "(`--stop-in-lock`)."
                if meta.get("stop_in_lock")
                else ""
            ),
            "",
            "| signal | events | gap min | median | max | bound | over bound | "
            "no takeover while stopped | signal to takeover (median) | exit codes |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |",
        ]
        for kind in KINDS:
            g = s["gaps"][kind]
            if not g.get("n"):
                continue
            codes = ", ".join(f"{code}: {n}" for code, n in sorted(g["exit_codes"].items()))
            lines.append(
                f"| {kind} | {s['events_by_kind'].get(kind, 0)} | {g['min']:.3f}s | "
                f"{g['median']:.3f}s | {g['max']:.3f}s | {g['bound']:.2f}s | {g['over_bound']} | "
                f"{stalled(g.get('no_takeover_while_stopped', []), kind)} | "
                f"{g['takeover_after_signal'].get('median', 0):.3f}s | {codes} |"
            )
        lines += [
            "",
            "| invariant | count |",
            "| --- | ---: |",
            f"| overlapping runs ([start, end] of two recorded runs intersect) | {s['overlapping_runs']} |",
            f"| slots recorded twice | {s['double_slots']} |",
            f"| runs under a term lower than one recorded before they started | {s['term_regressions']} |",
            f"| terms going down in commit order (database clock) | {s['term_order_violations_db_clock']} |",
            f"| runs recorded by a node that did not hold their term | {s['runs_by_non_holder']} |",
            f"| terms claimed by two nodes (node logs) | {s['terms_led_by_two_nodes']} |",
            f"| gaps beyond the bound | {sum(g['over_bound'] for g in s['gaps'].values())} |",
            f"| events with an anomaly | {s['anomalies']} |",
            "",
            f"- Runs recorded: {s['runs']}; seconds between run starts: median "
            f"{s['seconds_between_run_starts'].get('median')}, max "
            f"{s['seconds_between_run_starts'].get('max')}.",
            f"- Terms {t['first']} to {t['last']}: {t['count']} terms for {s['events']} events "
            f"(term step per event: {t['term_steps']}; terms not from an event: "
            f"{t['not_from_an_event'] or 'none'}); {t['with_runs']} terms with runs, without: "
            f"{t['without_runs'] or 'none'}; runs per term min {t['runs_per_term'].get('min')}, "
            f"median {t['runs_per_term'].get('median')}, max {t['runs_per_term'].get('max')}.",
            f"- SIGSTOP: held {s['stopped_nodes']['stopped_for'].get('min')}-"
            f"{s['stopped_nodes']['stopped_for'].get('max')}s; owner row expired before SIGCONT "
            f"{s['stopped_nodes']['owner_expired_before_sigcont']} of "
            f"{s['events_by_kind'].get(STOP, 0)}; exit after SIGCONT median "
            f"{s['gaps'][STOP]['exit_after'].get('median')}s.",
            f"- SIGTERM: exit after the takeover was seen median "
            f"{s['gaps'][TERM]['exit_after'].get('median')}s, max "
            f"{s['gaps'][TERM]['exit_after'].get('max')}s; after the signal median "
            f"{s['gaps'][TERM].get('exit_after_signal', {}).get('median', '-')}s.",
            f'- Completions refused to deposed leaders ("Not completing" in the node logs): '
            f"{s['completions_refused_to_deposed_leaders']}.",
            f"- Node logs: `{meta['logs']}`.",
        ]
        anomalous = [e for e in entry["events"] if e["anomalies"]]
        if anomalous:
            lines += ["", "Anomalies:", ""]
            lines += [
                f"- event {e['index']} ({e['kind']} of {e['holder']}, term {e['term']}): "
                + "; ".join(e["anomalies"])
                for e in anomalous
            ]
        lines += [
            "",
            "<details><summary>Every event</summary>",
            "",
            "| # | signal | holder (term) | new holder (term) | gap | signal to takeover | exit |",
            "| ---: | --- | --- | --- | ---: | ---: | ---: |",
        ]
        for e in entry["events"]:
            gap = "-" if e["gap"] is None else f"{e['gap']:.3f}s"
            if e.get("gap_at_least"):
                gap = f"{gap} (none while stopped: >= {e['gap_at_least']:.3f}s)"
            after = "-" if e["takeover_after"] is None else f"{e['takeover_after']:.3f}s"
            lines.append(
                f"| {e['index']} | {e['kind']} | {e['holder']} ({e['term']}) | "
                f"{e['new_holder'] or '-'} ({e['new_term'] or '-'}) | {gap} | {after} | "
                f"{e['exit_code']} |"
            )
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def stalled(lower_bounds: list[float], kind: str) -> str:
    """The SIGSTOP events with no takeover before SIGCONT, and how long the group had no leader."""
    if kind != STOP:
        return "-"
    if not lower_bounds:
        return "0"
    return f"{len(lower_bounds)} (leaderless >= {', '.join(f'{v:.1f}s' for v in lower_bounds)})"


def revision() -> str:
    """The commit the package ran at, ``+modified`` if its files differ from it (read-only git)."""
    changed = git("status", "--porcelain", "--", "django_tasks_coord")
    return (git("rev-parse", "--short", "HEAD") or "unknown") + (" +modified" if changed else "")


def others_running() -> list[str]:
    """Other benchmark processes on this machine (the run is timing-sensitive)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    mine = {str(os.getpid())}
    return [
        line.strip()
        for line in out.splitlines()[1:]
        if any(word in line for word in ("benchmarks/", "benchmarks.", "pgbench", "procrastinate"))
        and line.split()[0] not in mine
        and not line.split()[1].startswith("postgres:")
        and "chaos" not in line
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=sorted(SERVERS), default="postgres")
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--name", default="bench_chaos", help="The database to use (created).")
    parser.add_argument("--heartbeat", type=float, default=0.2, help="HEARTBEAT_FREQUENCY")
    parser.add_argument("--liveness", type=float, default=2.0, help="LIVENESS_INTERVAL")
    parser.add_argument("--interval", type=float, default=0.5, help="Seconds between job slots.")
    parser.add_argument(
        "--work-in-fence",
        action="store_true",
        help="Do the job's simulated work inside ctx.fenced() (a slow fenced write).",
    )
    parser.add_argument(
        "--stop-in-lock",
        action="store_true",
        help="Send each SIGSTOP while the holder holds the token_holder row lock (in the "
        "transaction that renews or fences under it). Reproduces a stalled election.",
    )
    parser.add_argument("--no-write", action="store_true", help="Print, do not store results.")
    args = parser.parse_args()
    if args.events < 1:
        parser.error("--events must be at least 1")
    busy = others_running()
    if busy:
        print("WARNING: other benchmark processes are running:\n  " + "\n  ".join(busy))

    config = common.database(args.database, args.name)
    create_database(config)
    settings = node_settings(args)
    env = environment(config, settings)
    setup_django(env)
    logs = Path(tempfile.mkdtemp(prefix=f"chaos-{args.database}-"))
    load_start = load_average()
    began, rev = time.monotonic(), revision()
    print(f"chaos run on {args.database}: {args.events} events, seed {args.seed}, logs in {logs}")
    cluster = Group(env, logs)
    try:
        events, facts = chaos(cluster, args)
        cluster.stop(timeout=15)
    finally:
        cluster.destroy()
    summary = analyze(events, facts, args, logs)

    import django
    from django.db import connection

    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "revision": rev,
        "revision_at_end": revision(),
        "database": f"{connection.display_name} {'.'.join(map(str, connection.get_database_version()))}",
        "python": platform.python_version(),
        "django": django.get_version(),
        "cpus": os.cpu_count(),
        "seed": args.seed,
        "interval": args.interval,
        "work_in_fence": args.work_in_fence,
        "stop_in_lock": args.stop_in_lock,
        "settings": settings,
        "load_start": load_start,
        "load_end": load_average(),
        "other_benchmarks_at_start": busy,
        "other_benchmarks_at_end": others_running(),
        "chaos_min": round(facts["chaos_s"] / 60, 1),
        "duration_min": round((time.monotonic() - began) / 60, 1),
        "logs": str(logs),
    }
    entry = {"meta": meta, "summary": summary, "events": [e.as_dict() for e in events]}
    print(json.dumps(summary, indent=2, default=str))
    if not args.no_write:
        variant = [
            f
            for f, on in (
                ("work in fence", args.work_in_fence),
                ("stop in lock", args.stop_in_lock),
            )
            if on
        ]
        write_results(args.database + (f" ({', '.join(variant)})" if variant else ""), entry)
        print(f"written: {RESULTS / 'chaos.json'}, {RESULTS / 'chaos.md'}")
    bad = (
        summary["overlapping_runs"]
        + summary["double_slots"]
        + summary["term_regressions"]
        + summary["runs_by_non_holder"]
        + summary["terms_led_by_two_nodes"]
        + summary["anomalies"]
    )
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
