"""Backend tests need Django's task framework (Django 6+, or the django-tasks backport on 5.2).

Without it only ``test_import.py`` runs: it checks the backend's import error.
"""

from __future__ import annotations

import json
import signal
import subprocess
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

HAS_TASKS = bool(find_spec("django.tasks") or find_spec("django_tasks"))

#: Without the framework, every module but the import test would fail to import.
collect_ignore = (
    []
    if HAS_TASKS
    else [
        path.name
        for path in Path(__file__).parent.glob("*.py")
        if path.name not in {"__init__.py", "conftest.py", "test_import.py"}
    ]
)

#: Node timings for the subprocesses (fast heartbeats and polls, no status lines).
FAST = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "POLL_INTERVAL": 0.05,
    "STATUS_INTERVAL": 0,
    "REAP_INTERVAL": 0.3,
}


class Worker:
    """How a backend's tasks get run by real OS processes (one kind per backend path)."""

    def __init__(self, backend_path: str, tasks_setting: dict[str, Any]) -> None:
        self.backend_path = backend_path
        self.tasks_setting = tasks_setting

    def start(self, *args: str, settings: dict[str, Any] | None = None) -> subprocess.Popen[str]:
        """Start a node (``manage.py runscheduler ARGS``) for this backend."""
        from tests.processes import start

        return start(
            "django",
            "runscheduler",
            *args,
            TASKS_COORD_JSON=json.dumps({**FAST, **(settings or {})}),
            TASKS_JSON=json.dumps(self.tasks_setting),
        )

    def drain(self, *args: str, settings: dict[str, Any] | None = None, rounds: int = 8) -> str:
        """Run ``--burst`` nodes until no task of the backend is due (retries included).

        A retry is due at once (the test tasks retry without delay), yet a burst node can
        exit just before it is: MySQL's clock compares in whole seconds. Another round
        takes it.
        """
        from django.db.models import Q
        from django.utils import timezone

        from django_tasks_coord.models import Task
        from django_tasks_coord.queue import TaskState

        output = ""
        for _ in range(rounds):
            proc = self.start("--burst", *args, settings=settings)
            out, err = wait_exit(proc)
            output += out + err
            assert proc.returncode == 0, output
            due = Q(execute_at__isnull=True) | Q(execute_at__lte=timezone.now())
            if not Task.objects.filter(due, state=TaskState.PENDING).exists():
                break
        return output


def wait_exit(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    """Wait for a process that exits by itself; kill it (and fail later) if it does not."""
    from tests.processes import reap

    try:
        return proc.communicate(timeout=timeout)  # drains its pipes while it runs
    except subprocess.TimeoutExpired:
        return reap(proc, signal.SIGKILL)


#: Backend paths under test, with the QUEUES they are configured with.
BACKENDS = ["django_tasks_coord.backends.DatabaseBackend"]
QUEUES = ["default", "high", "other"]


@pytest.fixture(params=BACKENDS)
def worker(request: pytest.FixtureRequest, settings: Any) -> Worker:
    """The backend under test, configured as ``TASKS["default"]`` here and in its nodes."""
    tasks_setting = {"default": {"BACKEND": request.param, "QUEUES": QUEUES}}
    settings.TASKS = tasks_setting
    return Worker(request.param, tasks_setting)
