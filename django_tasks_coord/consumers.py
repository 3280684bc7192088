"""The app's own consumers, imported by ``runscheduler`` like every app's ``consumers.py``.

When ``TASKS`` configures :class:`django_tasks_coord.backends.DatabaseBackend` (or a
subclass), the node processes that backend's queues (see :func:`django_tasks_coord.backends.housekeeping.prepare_node`).
"""

from __future__ import annotations

from importlib.util import find_spec

from django.conf import settings


def _names_this_backend() -> bool:
    configured = getattr(settings, "TASKS", None) or {}
    return any(
        str(params.get("BACKEND", "")).startswith("django_tasks_coord.backends")
        for params in configured.values()
        if isinstance(params, dict)
    )


if find_spec("django.tasks") is not None or find_spec("django_tasks") is not None:
    from django_tasks_coord.backends.housekeeping import prepare_node

    prepare_node()  # a no-op unless TASKS has a DatabaseBackend (or a subclass)
elif _names_this_backend():
    import django_tasks_coord.backends  # noqa: F401  (fails, saying what to install)
