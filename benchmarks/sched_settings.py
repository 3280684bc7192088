"""Django settings for the ``runscheduler`` nodes ``benchmarks/scheduling.py`` starts.

From environment variables:

- ``BENCH_DATABASE``: the ``DATABASES["default"]`` dict, as JSON (required).
- ``BENCH_TASKS_COORD``: the ``TASKS_COORD`` dict, as JSON (node settings under test).

The job functions (``benchmarks/benchapp_sched/jobs.py``) are imported by their dotted
paths; no benchmark app is installed, so the nodes declare no jobs and own no consumers
besides the jobs topic's.
"""

from __future__ import annotations

import json
import os

from benchmarks import common
from benchmarks.common import DEBUG, DEFAULT_AUTO_FIELD, LOGGING, SECRET_KEY, TIME_ZONE, USE_TZ  # noqa: F401

DATABASES = {"default": json.loads(os.environ["BENCH_DATABASE"])}
INSTALLED_APPS = list(common.BASE_APPS)
TASKS_COORD = json.loads(os.environ.get("BENCH_TASKS_COORD", "{}"))
