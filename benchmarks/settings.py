"""Django settings of every process a benchmark starts: nodes, servers and peer workers.

One module for every benchmark, driven by environment variables (``common.bench_env()``
sets them):

- ``BENCH_DATABASE``: the ``DATABASES["default"]`` dict, as JSON; without it,
  ``DATABASE_URL`` (django-environ syntax, e.g. ``postgres://root@127.0.0.1:5432/bench``).
  One of the two is required.
- ``BENCH_APP``: the benchmark app installed beside the package: ``benchapp`` (default: the
  ``noop`` and ``latency`` consumers), ``benchapp_idle`` (counts a node's SQL statements,
  for ``idle_load``), ``benchapp_profile`` (a node's CPU and statements, for
  ``task_profile``), ``chaosapp`` (the leader-only job of ``chaos``), ``faultapp`` (the workload of
  ``faults``) or ``none`` (the
  package alone, for ``scheduling``: its job functions are imported by dotted path).
- ``BENCH_SYSTEM``: ``coord`` (default: this project) or ``tasks_db`` (django-tasks-db's
  ``db_worker``, run from the peers' virtualenv, where this project is not installed).
- ``BENCH_TASKS_COORD``: the ``TASKS_COORD`` dict, as JSON (node settings under test).
- ``BENCH_TASKS_BACKEND``: ``1`` sets ``TASKS`` to this project's ``DatabaseBackend`` on
  the queue ``default`` (``django_tasks``).
- ``BENCH_NODE``: a node's id; on PostgreSQL it becomes the connections'
  ``application_name``, so ``pg_stat_activity`` tells which node holds what (``chaos``).
- ``BENCH_STATEMENT_LOG``: read by ``benchapp_idle``, not here.

``LOGGING``: warnings to stderr; ``runscheduler`` logs the package to stdout itself.
"""

from __future__ import annotations

import json
import os

from benchmarks import common
from benchmarks.common import DEBUG, DEFAULT_AUTO_FIELD, LOGGING, SECRET_KEY, TIME_ZONE, USE_TZ  # noqa: F401

APPS = {
    "benchapp": "benchmarks.benchapp",
    "benchapp_idle": "benchmarks.benchapp_idle",
    "benchapp_profile": "benchmarks.benchapp_profile.apps.ProfileBenchConfig",
    "chaosapp": "benchmarks.chaosapp",
    "faultapp": "benchmarks.faultapp",
    "none": None,
}
SYSTEM = os.environ.get("BENCH_SYSTEM", "coord")
APP = os.environ.get("BENCH_APP", "benchapp")

if "BENCH_DATABASE" in os.environ:
    DATABASES = {"default": json.loads(os.environ["BENCH_DATABASE"])}
elif "DATABASE_URL" in os.environ:
    DATABASES = {"default": common.database_from_url(os.environ["DATABASE_URL"])}
else:
    raise KeyError("benchmarks.settings needs BENCH_DATABASE (JSON) or DATABASE_URL.")
if os.environ.get("BENCH_NODE") and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = os.environ["BENCH_NODE"]

if SYSTEM == "coord":
    if APP not in APPS:
        raise ValueError(f"Unknown BENCH_APP {APP!r}: use one of {', '.join(APPS)}.")
    INSTALLED_APPS = [*common.BASE_APPS, *([APPS[APP]] if APPS[APP] else [])]
    TASKS_COORD = json.loads(os.environ.get("BENCH_TASKS_COORD", "{}"))
    if os.environ.get("BENCH_TASKS_BACKEND") == "1":
        TASKS = {
            "default": {
                "BACKEND": "django_tasks_coord.backends.DatabaseBackend",
                "QUEUES": ["default"],
            }
        }
elif SYSTEM == "tasks_db":
    INSTALLED_APPS = ["django_tasks_db"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
else:
    raise ValueError(f"Unknown BENCH_SYSTEM {SYSTEM!r}: use 'coord' or 'tasks_db'.")
