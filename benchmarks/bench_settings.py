"""Django settings for the subprocesses ``benchmarks/throughput.py`` starts.

Everything comes from environment variables, so one module serves every system measured:

- ``BENCH_DATABASE``: the ``DATABASES["default"]`` dict, as JSON (required).
- ``BENCH_SYSTEM``: ``coord`` (default: this project's ``runscheduler``) or ``tasks_db``
  (django-tasks-db's ``db_worker``, run from the peers' virtualenv, where this project is
  not installed).
- ``BENCH_TASKS_COORD``: the ``TASKS_COORD`` dict, as JSON (node settings under test).
"""

from __future__ import annotations

import json
import os

from benchmarks import common
from benchmarks.common import DEBUG, DEFAULT_AUTO_FIELD, LOGGING, SECRET_KEY, TIME_ZONE, USE_TZ  # noqa: F401

SYSTEM = os.environ.get("BENCH_SYSTEM", "coord")

DATABASES = {"default": json.loads(os.environ["BENCH_DATABASE"])}

if SYSTEM == "coord":
    INSTALLED_APPS = [*common.BASE_APPS, "benchmarks.benchapp"]
    TASKS_COORD = json.loads(os.environ.get("BENCH_TASKS_COORD", "{}"))
elif SYSTEM == "tasks_db":
    INSTALLED_APPS = ["django_tasks_db"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
else:
    raise ValueError(f"Unknown BENCH_SYSTEM {SYSTEM!r}: use 'coord' or 'tasks_db'.")
