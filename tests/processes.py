"""Helpers for tests that start OS processes against the test database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
