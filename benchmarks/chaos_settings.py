"""Django settings for ``benchmarks/chaos.py`` and the ``runscheduler`` nodes it starts.

Everything comes from environment variables, set by the chaos script:

- ``CHAOS_DATABASE``: the ``DATABASES["default"]`` dict, as JSON (required).
- ``CHAOS_TASKS_COORD``: the ``TASKS_COORD`` dict, as JSON (the nodes' short intervals).
- ``CHAOS_NODE``: the node id of a ``runscheduler`` process; on PostgreSQL it becomes the
  connections' ``application_name``, so ``pg_stat_activity`` tells which node holds what.
"""

from __future__ import annotations

import json
import os

from benchmarks import common

# LOGGING: runscheduler logs the package to stdout itself (the chaos script keeps one file
# per node); everything else: warnings to stderr.
from benchmarks.common import DEBUG, DEFAULT_AUTO_FIELD, LOGGING, SECRET_KEY, TIME_ZONE, USE_TZ  # noqa: F401

DATABASES = {"default": json.loads(os.environ["CHAOS_DATABASE"])}
if os.environ.get("CHAOS_NODE") and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = os.environ["CHAOS_NODE"]
INSTALLED_APPS = [*common.BASE_APPS, "benchmarks.chaosapp"]
TASKS_COORD = json.loads(os.environ.get("CHAOS_TASKS_COORD", "{}"))
