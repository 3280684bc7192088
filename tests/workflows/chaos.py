"""Workflows under SIGKILL: real ``runscheduler`` nodes run fan-out/fan-in workflows while one
of them is killed every 1-3 s (and replaced, so work goes on).

Shared by the test (``tests/workflows/test_chaos.py``, a short run) and the benchmark
(``benchmarks/workflows.py``, 200 workflows). Each workflow has 10 push steps for the test
consumer ``chaos`` (``tests/testapp/consumers.py``: ``work`` with 1,000 attempts, since each
kill counts an attempt of every task the node held, running or buffered): a root, 8 steps
after it (fan-out), and a fan-in after the 8 (``results=True``). Every step's handler records
its execution (a ``Run`` of topic ``chaos``, committed at once, with the node's pid), works
``sleep`` seconds,
then commits its side effect (a ``Run`` of topic ``fenced``) **in the transaction that
completes its task under its claim** (``queue.complete``): a handler whose claim was lost
(its node declared dead, the task given to another) commits neither.

:func:`verify` then checks what must hold (docs/guarantees.md):

- every workflow ended SUCCEEDED;
- every fan-in step became exactly one task (enqueued once), which got its 8 parents' results;
- every step's fenced side effect committed exactly once;
- a step ran more than once only when its earlier runs were cut off by a kill: at most one
  run by a node that was never killed (execution is at least once; the duplicates are the
  runs of killed nodes).
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from django_tasks_coord import queue, workflows
from django_tasks_coord.models import Owner, Task, Workflow, WorkflowState, WorkflowStep
from tests.processes import reap, runscheduler, wait_for
from tests.testapp.models import Run

#: Node settings: quick heartbeats and expiry, so that a killed node's tasks come back soon.
SETTINGS = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "LIVENESS_INTERVAL": 1.5,
    "REAP_INTERVAL": 0.5,
    "POLL_INTERVAL": 0.1,
    "WORKFLOW_POLL_INTERVAL": 0.2,
    "STATUS_INTERVAL": 0,
    "SHUTDOWN_MAX_WAIT": 2,
    "WORKERS": 4,
}
TOPIC = "chaos"
FAN_OUT = 8
NODES = 3


def start_workflows(count: int, *, sleep: float = 0.3) -> list[int]:
    """Start ``count`` workflows of 1 + ``FAN_OUT`` + 1 steps; their ids."""
    queue.register_topic(TOPIC)
    ids = []
    for n in range(count):
        payload = {"fenced": True, "sleep": sleep}
        root = workflows.push(TOPIC, f"c{n}-root", payload, name="root")
        fan = [
            workflows.push(TOPIC, f"c{n}-fan{i}", payload, name=f"fan{i}") for i in range(FAN_OUT)
        ]
        join = workflows.push(TOPIC, f"c{n}-join", payload, name="join", results=True)
        chain = workflows.chain(root, workflows.group(fan), join)
        ids.append(workflows.start(f"chaos {n}", chain))
    return ids


@dataclass
class Chaos:
    """What a run did: its duration, the kills and the pids of the killed nodes."""

    workflows: list[int]
    seconds: float = 0.0
    kills: int = 0
    killed: set[int] = field(default_factory=set)
    nodes_started: int = 0
    exit_codes: list[int] = field(default_factory=list)
    finished: bool = False


def node(name: str) -> subprocess.Popen[str]:
    return runscheduler("--node-id", name, "--topic", TOPIC, "-v", "0", settings=SETTINGS)


def run(
    ids: list[int], *, seed: int = 1, every: tuple[float, float] = (1.0, 3.0), timeout: float = 300
) -> Chaos:
    """Run :data:`NODES` nodes on ``ids``, SIGKILLing one (chosen at random) every ``every``
    seconds (uniform) and starting a replacement, until every workflow ended (or
    ``timeout``); then stop the nodes (SIGTERM)."""
    rng = random.Random(seed)
    chaos = Chaos(ids)
    names = iter(f"n{i}" for i in range(10_000))
    nodes = {name: node(name) for name in (next(names) for _ in range(NODES))}
    chaos.nodes_started = NODES
    pending = Workflow.objects.filter(pk__in=ids, state=WorkflowState.RUNNING)
    started = time.monotonic()
    try:
        wait_for(lambda: Owner.objects.count() >= NODES, timeout=60)
        next_kill = time.monotonic() + rng.uniform(*every)
        while pending.exists():
            if time.monotonic() - started > timeout:
                break
            if time.monotonic() >= next_kill:
                victim = rng.choice(sorted(nodes))
                proc = nodes.pop(victim)
                chaos.killed.add(proc.pid)
                reap(proc, signal.SIGKILL)
                chaos.kills += 1
                name = next(names)
                nodes[name] = node(name)  # a replacement, as a supervisor would start
                chaos.nodes_started += 1
                next_kill = time.monotonic() + rng.uniform(*every)
            time.sleep(0.05)  # polling the workflows' states between kills
        chaos.finished = not pending.exists()
        chaos.seconds = time.monotonic() - started
        # A replacement stopped before it set up its signal handlers would die of SIGTERM.
        wait_for(lambda: Owner.objects.filter(name__in=list(nodes)).count() == len(nodes))
    finally:
        for proc in nodes.values():
            reap(proc, signal.SIGTERM)
            chaos.exit_codes.append(proc.returncode)
    return chaos


def verify(chaos: Chaos) -> dict[str, Any]:
    """The figures of a run and its violations (each list must be empty)."""
    ids = chaos.workflows
    count = len(ids)
    states = Counter(Workflow.objects.filter(pk__in=ids).values_list("state", flat=True))
    steps = [f"c{n}-{s}" for n in range(count) for s in ["root", "join", *_fans()]]
    joins = Counter(
        Task.objects.filter(topic_id=TOPIC, identifier__endswith="-join").values_list(
            "identifier", flat=True
        )
    )
    join_results = {
        identifier: len((payload or {}).get("results") or {})
        for identifier, payload in Task.objects.filter(
            topic_id=TOPIC, identifier__endswith="-join"
        ).values_list("identifier", "payload")
    }
    fenced = Counter(Run.objects.filter(topic="fenced").values_list("identifier", flat=True))
    runs: dict[str, list[int]] = defaultdict(list)
    for identifier, pid in Run.objects.filter(topic=TOPIC).values_list("identifier", "pid"):
        runs[identifier].append(pid)
    survivors_twice = {
        identifier: pids
        for identifier, pids in runs.items()
        if len([pid for pid in pids if pid not in chaos.killed]) > 1
    }
    reruns = sum(len(pids) - 1 for pids in runs.values())
    failed = list(
        WorkflowStep.objects.filter(workflow_id__in=ids)
        .exclude(state="succeeded")
        .values_list("workflow_id", "name", "state", "message")[:20]
    )
    return {
        "workflows": count,
        "steps": len(steps),
        "seconds": round(chaos.seconds, 1),
        "kills": chaos.kills,
        "nodes_started": chaos.nodes_started,
        "states": dict(states),
        "executions": sum(len(p) for p in runs.values()),
        "reruns_after_kills": reruns,
        "most_attempts": max(
            Task.objects.filter(topic_id=TOPIC).values_list("attempts", flat=True), default=0
        ),
        "steps_not_succeeded": [list(row) for row in failed],
        "fan_in_reruns": sum(
            len(runs[f"c{n}-join"]) - 1 for n in range(count) if runs[f"c{n}-join"]
        ),
        "violations": {
            "not_succeeded": [i for i in ids if not _succeeded(i)],
            "fan_in_not_enqueued_once": [
                f"c{n}-join" for n in range(count) if joins[f"c{n}-join"] != 1
            ],
            "fan_in_without_all_results": [
                name for name, n in join_results.items() if n != FAN_OUT
            ],
            "fenced_not_once": [s for s in steps if fenced[s] != 1],
            "run_twice_by_surviving_nodes": sorted(survivors_twice),
            "unclean_exits": [code for code in chaos.exit_codes if code != 0],
        },
    }


def _fans() -> list[str]:
    return [f"fan{i}" for i in range(FAN_OUT)]


def _succeeded(workflow_id: int) -> bool:
    return Workflow.objects.filter(pk=workflow_id, state=WorkflowState.SUCCEEDED).exists()
