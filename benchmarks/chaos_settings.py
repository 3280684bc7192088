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

DATABASES = {"default": json.loads(os.environ["CHAOS_DATABASE"])}
if os.environ.get("CHAOS_NODE") and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = os.environ["CHAOS_NODE"]
SECRET_KEY = "benchmarks-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_tasks_coord",
    "benchmarks.chaosapp",
]
TASKS_COORD = json.loads(os.environ.get("CHAOS_TASKS_COORD", "{}"))

# runscheduler logs the package to stdout itself (the chaos script keeps one file per
# node); everything else: warnings to stderr.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}
