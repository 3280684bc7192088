"""Helpers for tests that start OS processes against the test database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
_KEYS = ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that must use this test run's database."""
    settings = {key: connection.settings_dict[key] for key in _KEYS}
    settings["NAME"] = str(settings["NAME"])
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TASKS_COORD_TEST_DB": json.dumps(settings),
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def start(module: str, *args: str, **env: str) -> subprocess.Popen[str]:
    """Start ``python -m module args...`` with pipes for stdin/stdout (text mode)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=subprocess_env(**env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def reap(proc: subprocess.Popen[str], sig: int | None = None) -> tuple[str, str]:
    """Send ``sig`` (if given and the process still runs), wait for it, close its pipes.

    Returns what it wrote to stdout and stderr.
    """
    if sig is not None and proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def run_together(module: str, *args: str, count: int, rendezvous: tuple[str, ...] = ()) -> list:
    """Run ``count`` worker processes ``python -m module args`` that race each other.

    Each worker prints ``ready`` and waits for a line on stdin; they are released together.
    For each prefix in ``rendezvous``, every worker must then print a line starting with it
    (and wait again) before all are released once more. Each worker's last stdout line is
    JSON; the list of them is returned. Workers left behind by a failure are killed.
    """
    procs = [start(module, *args) for _ in range(count)]

    def each_says(prefix: str) -> None:
        for proc in procs:
            assert proc.stdout.readline().startswith(prefix), proc.stderr.read()

    def release() -> None:
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()

    try:
        each_says("ready")
        for prefix in rendezvous:
            release()
            each_says(prefix)
        release()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            reap(proc, signal.SIGKILL)


def wait_for(
    predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"condition not met within {timeout}s: {predicate.__doc__ or predicate}"
            )
        time.sleep(interval)  # polling a condition with a deadline, not waiting for time to pass


def runscheduler(*args: str, settings: dict[str, object] | None = None) -> subprocess.Popen[str]:
    """Start ``manage.py runscheduler ARGS`` on the test database."""
    env = {"TASKS_COORD_JSON": json.dumps(settings or {})}
    return start("django", "runscheduler", *args, **env)


class Output:
    """Reads a process's stdout in a thread, noting when each line arrived (monotonic)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def line_at(self, text: str, timeout: float = 60.0) -> float:
        """When the first line containing ``text`` arrived; waits for it."""

        def arrived() -> float | None:
            return next((at for at, line in list(self.lines) if text in line), None)

        wait_for(lambda: arrived() is not None or not self._thread.is_alive(), timeout)
        at = arrived()
        assert at is not None, f"no line {text!r} in:\n{self.text()}"
        return at

    def text(self) -> str:
        """Everything read so far."""
        return "\n".join(line for _, line in self.lines)

    def finish(self, timeout: float = 60.0) -> tuple[float, str, str]:
        """Wait for the exit: (monotonic time of the exit, stdout, stderr)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        ended = time.monotonic()
        self._thread.join(10)
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return ended, self.text(), err


def stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (SIGSTOP is delivered asynchronously:
    a thread may go on for an instant after ``kill`` returns)."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        except OSError:  # a thread that ended meanwhile
            continue
    return bool(states) and all(state in "Tt" for state in states)
