"""Settings for the nodes ``benchmarks/django_tasks.py`` starts: ``bench_settings`` plus ``TASKS``.

``BENCH_DATABASE`` and ``BENCH_TASKS_COORD`` as in ``benchmarks/bench_settings.py``.
"""

from __future__ import annotations

from benchmarks.bench_settings import *  # noqa: F403

TASKS = {
    "default": {
        "BACKEND": "django_tasks_coord.backends.DatabaseBackend",
        "QUEUES": ["default"],
    }
}
