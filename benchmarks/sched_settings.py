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

DATABASES = {"default": json.loads(os.environ["BENCH_DATABASE"])}
SECRET_KEY = "benchmarks-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_tasks_coord"]
TASKS_COORD = json.loads(os.environ.get("BENCH_TASKS_COORD", "{}"))

# Quiet nodes: the benchmark reads the database, not the logs.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}
