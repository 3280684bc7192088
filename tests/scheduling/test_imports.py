"""Importing scheduling has no side effects: the app's ready() registers the jobs consumer."""

from __future__ import annotations

import os
import subprocess
import sys

from django_tasks_coord import handlers
from django_tasks_coord.scheduling import JOBS_TOPIC, runner
from tests.processes import ROOT

# Every scheduling module, imported after Django is set up but with the app's ready() left
# out: the jobs topic must still have no consumer.
_IMPORT_ALL = """
import django
from django_tasks_coord.apps import TasksCoordConfig
TasksCoordConfig.ready = lambda self: None
django.setup()
from django_tasks_coord import handlers
from django_tasks_coord.scheduling import declared, definition, jobs, names, planner, runner, scheduler
assert names.JOBS_TOPIC not in handlers.registry.consumers(), handlers.registry.consumers()
runner.register()
assert handlers.registry.consumers()[names.JOBS_TOPIC] is runner.job_task_type
"""


def test_the_app_registers_the_jobs_consumer():
    assert handlers.registry.consumers()[JOBS_TOPIC] is runner.job_task_type


def test_importing_scheduling_registers_no_consumer():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
