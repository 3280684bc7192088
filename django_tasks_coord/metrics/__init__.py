"""Prometheus metrics (optional: the ``[metrics]`` extra, ``prometheus_client``).

Two sources, documented metric by metric in ``docs/reference/metrics.md``:

- **Queue state**, read from the database at each scrape by the view
  :func:`django_tasks_coord.metrics.views.metrics` (mount ``django_tasks_coord.urls``):
  tasks per topic and state, the oldest due pending task per topic, live nodes,
  leaders, jobs (:mod:`django_tasks_coord.metrics.state` reads them, cheaply at any
  table size; :mod:`django_tasks_coord.metrics.collector` turns them into metrics).
- **Node activity**, counted inside each ``runscheduler`` process and served on its
  own port (``--metrics-port``): tasks processed, durations, start delays, claims,
  held tasks, busy workers (:mod:`django_tasks_coord.metrics.node`).

Without ``prometheus_client`` nothing here is imported by the rest of the package;
mounting the view or passing ``--metrics-port`` raises :class:`ConfigurationError`.
"""

from __future__ import annotations

from types import ModuleType

from django_tasks_coord.exceptions import ConfigurationError

#: The prefix of every metric's name.
PREFIX = "tasks_coord_"


def require() -> ModuleType:
    """``prometheus_client``, or :class:`ConfigurationError` saying how to install it."""
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError(
            "Prometheus metrics need the prometheus_client package: install "
            "django-tasks-coord[metrics] (or remove the metrics URL / --metrics-port)."
        ) from exc
    return prometheus_client
