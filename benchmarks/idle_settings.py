"""Django settings for the ``runscheduler`` nodes ``benchmarks/idle_load.py`` starts.

From environment variables:

- ``BENCH_DATABASE``: the ``DATABASES["default"]`` dict, as JSON (required).
- ``BENCH_TASKS_COORD``: the ``TASKS_COORD`` dict, as JSON (node settings under test).
- ``BENCH_STATEMENT_LOG``: where the node writes the log of its SQL statements at exit
  (``benchapp_idle``, an execute wrapper on each of its connections).

No consumers are installed: the nodes process the jobs topic only, and no job is defined.
"""

from __future__ import annotations

import json
import os

from benchmarks import common
from benchmarks.common import DEBUG, DEFAULT_AUTO_FIELD, LOGGING, SECRET_KEY, TIME_ZONE, USE_TZ  # noqa: F401

DATABASES = {"default": json.loads(os.environ["BENCH_DATABASE"])}
INSTALLED_APPS = [*common.BASE_APPS, "benchmarks.benchapp_idle"]
TASKS_COORD = json.loads(os.environ.get("BENCH_TASKS_COORD", "{}"))
