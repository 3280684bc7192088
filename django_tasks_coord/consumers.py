"""The app's own consumers, imported by ``runscheduler`` like every app's ``consumers.py``.

When ``TASKS`` configures :class:`django_tasks_coord.backends.DatabaseBackend`, the node
processes that backend's queues (see :func:`django_tasks_coord.backends.housekeeping.prepare_node`).
"""

from __future__ import annotations

from django.conf import settings


def _uses_task_backend() -> bool:
    configured = getattr(settings, "TASKS", None) or {}
    return any(
        str(params.get("BACKEND", "")).startswith("django_tasks_coord.backends")
        for params in configured.values()
        if isinstance(params, dict)
    )


if _uses_task_backend():
    from django_tasks_coord.backends.housekeeping import prepare_node

    prepare_node()
