"""Nodes for the benchmarks: ``runscheduler`` subprocesses started, watched and stopped together.

Every benchmark that runs nodes goes through :class:`Cluster`::

    with Cluster(common.bench_env(config)) as cluster:
        cluster.start_many(3, "--topic", "noop", "-v", "0")
        cluster.wait_ready("default")          # registered (and LISTENing on PostgreSQL)
        ...
        cluster.wait_for(lambda: done() == n, "the drain", timeout=60)
    # leaving the block: SIGTERM to every node, killed if still there 60 s later

Each node is ``python -m django runscheduler ARGS`` with the cluster's environment (plus
its own), run from the repository root, or from ``source`` (another checkout, or a
directory holding another copy of the package), which then comes first on ``PYTHONPATH``
so that the nodes import that package and this checkout's ``benchmarks``. A thread per
node reads its output: each line is kept with the moment it arrived (``line_at()``) and
written to the node's log file, in ``logs`` (kept) or a temporary directory (removed when
the cluster is).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from benchmarks.common import ROOT, query


class ClusterError(RuntimeError):
    """A node exited while the benchmark needed it, or a condition was not met in time."""


@dataclasses.dataclass(eq=False)
class Node:
    """One ``runscheduler`` subprocess, its output and what the benchmark did to it."""

    name: str
    proc: subprocess.Popen[str]
    log: Path
    lines: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    stopped: bool = False  # SIGSTOPped, not continued yet
    signalled: bool = False  # its end was caused by the benchmark
    reported: bool = False  # its unexpected end was reported (Cluster.casualties)
    reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def read(self, out: IO[str]) -> None:
        """Copy the node's output to its log, keeping each line with when it arrived."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            out.write(line)
            out.flush()
        out.close()

    def output(self, chars: int = 3000) -> str:
        """The last ``chars`` characters the node printed."""
        return "\n".join(line for _, line in self.lines)[-chars:]

    def tail(self, lines: int = 40) -> str:
        return "\n".join(line for _, line in self.lines[-lines:])

    def line_at(self, text: str, timeout: float = 120) -> float:
        """When (``time.monotonic()``) the first line containing ``text`` arrived; waits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if text in line:
                    return at
            if not self.alive and not (self.reader and self.reader.is_alive()):
                break
            time.sleep(0.01)  # polling the output with a deadline
        raise ClusterError(f"{self.name}: no line {text!r}:\n{self.output()}")

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` (SIGSTOP and SIGCONT are tracked: ``stopped``)."""
        if sig == signal.SIGCONT:
            self.stopped = False
        os.kill(self.proc.pid, sig)
        if sig == signal.SIGSTOP:
            self.stopped = True

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit (and the last of its output); its exit code."""
        code = self.proc.wait(timeout)
        if self.reader is not None:
            self.reader.join(10)
        return code

    def destroy(self) -> None:
        """Kill it whatever state it is in (a stopped process is continued first)."""
        if self.alive:
            if self.stopped:
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.wait()


class Cluster:
    """``runscheduler`` nodes sharing an environment; a context manager that stops them all."""

    def __init__(
        self,
        env: dict[str, str],
        *,
        source: Path | None = None,
        logs: Path | None = None,
        new_session: bool = False,
        python: str = sys.executable,
    ) -> None:
        """``new_session``: the nodes do not get the benchmark's Ctrl-C (it stops them)."""
        self.env = dict(env)
        self.cwd = source or ROOT
        if source is not None:
            self.env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(source), str(ROOT)]))
        self._tmp = None if logs else Path(tempfile.mkdtemp(prefix="bench_nodes_"))
        self.logs: Path = logs or self._tmp  # type: ignore[assignment]
        self.logs.mkdir(parents=True, exist_ok=True)
        self.new_session, self.python = new_session, python
        self.nodes: dict[str, Node] = {}
        self.codes: list[int] = []

    # --- starting ---------------------------------------------------------------------------

    def start(self, *args: str, name: str | None = None, env: dict[str, str] | None = None) -> Node:
        """Start ``runscheduler ARGS`` (a node called ``name``: its log file's name)."""
        name = name or f"node{len(self.nodes)}"
        proc = subprocess.Popen(
            [self.python, "-m", "django", "runscheduler", *map(str, args)],
            cwd=self.cwd,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=self.new_session,
        )
        node = Node(name, proc, self.logs / f"{name}.log")
        node.reader = threading.Thread(
            target=node.read, args=(node.log.open("w"),), name=f"{name}-output", daemon=True
        )
        node.reader.start()
        self.nodes[name] = node
        return node

    def start_many(self, count: int, *args: str) -> list[Node]:
        return [self.start(*args) for _ in range(count)]

    # --- watching ---------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        return [node.pid for node in self.nodes.values()]

    def live(self) -> list[Node]:
        return [node for node in self.nodes.values() if node.alive]

    def casualties(self) -> list[Node]:
        """Nodes that ended without a signal from the benchmark (reported once each)."""
        dead = [n for n in self.nodes.values() if not (n.alive or n.signalled or n.reported)]
        for node in dead:
            node.reported = True
        return dead

    def output(self, chars: int = 3000) -> str:
        """The last output of every node, one section each."""
        return "\n".join(f"--- {n.name} ---\n{n.output(chars)}" for n in self.nodes.values())

    def wait_for(
        self, condition: Callable[[], object], what: str, timeout: float, every: float = 0.05
    ) -> None:
        """Check ``condition`` every ``every`` s until it holds; raise :class:`ClusterError`
        with the nodes' output if one of them exited or ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while not condition():
            if any(not n.alive for n in self.nodes.values() if not n.signalled):
                raise ClusterError(f"A node exited before {what}.\n{self.output()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"No {what} within {timeout} s.\n{self.output()}")
            time.sleep(every)  # polling a condition with a deadline

    def wait_ready(self, alias: str, *, timeout: float = 120, listen: bool | None = None) -> None:
        """Wait until every live node registered (its owner row, read on database ``alias``)
        and, on PostgreSQL (or if ``listen``), holds its LISTEN connection."""
        pids = [node.pid for node in self.live()]
        marks = ", ".join(["%s"] * len(pids))
        owners = f"SELECT count(*) FROM django_tasks_coord_owner WHERE pid IN ({marks})"
        self.wait_for(
            lambda: query(alias, owners, pids)[0][0] == len(pids), "registration", timeout
        )
        if listen is None:
            from django.db import connections

            listen = connections[alias].vendor == "postgresql"
        if listen:
            listening = (
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
            )
            self.wait_for(lambda: query(alias, listening)[0][0] >= len(pids), "LISTEN", timeout)

    # --- stopping ---------------------------------------------------------------------------

    def stop(self, timeout: float = 60, nodes: Iterable[Node] | None = None) -> list[int]:
        """Stop nodes gracefully (all by default): SIGCONT to a stopped one, SIGTERM to each
        still running, then wait for each; one not gone ``timeout`` seconds later is killed.
        Their exit codes (also kept in ``codes``)."""
        nodes = list(self.nodes.values() if nodes is None else nodes)
        for node in nodes:
            if node.alive:
                node.signalled = True
                if node.stopped:
                    node.signal(signal.SIGCONT)
                node.proc.send_signal(signal.SIGTERM)
        codes = []
        for node in nodes:
            try:
                codes.append(node.wait(timeout))
            except subprocess.TimeoutExpired:
                node.destroy()
                codes.append(node.proc.returncode)
        self.codes = codes
        return codes

    def destroy(self) -> None:
        """Kill every node left, whatever its state; remove the temporary logs."""
        for node in self.nodes.values():
            node.destroy()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if any(node.alive for node in self.nodes.values()):
                self.stop()
        finally:
            self.destroy()


def run_node(env: dict[str, str], *args: str, **options: Any) -> tuple[int, float, str]:
    """Run one node until it exits by itself (``--burst``): its exit code, wall time and output.

    ``options`` go to :class:`Cluster` (``source``...).
    """
    with Cluster(env, **options) as cluster:
        started = time.perf_counter()
        node = cluster.start(*args)
        code = node.wait()
        return code, time.perf_counter() - started, node.output(4000)
