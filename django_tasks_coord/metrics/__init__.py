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

from django_tasks_coord.metrics.client import PREFIX, require

__all__ = ["PREFIX", "require"]
