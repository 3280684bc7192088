"""The no-op task for django-tasks-db (``django.tasks``), imported in the peers' virtualenv only.

django-tasks-db's ``db_worker`` imports it by the dotted path stored with each task
(``benchmarks.benchapp.peer_tasks.noop``).
"""

from __future__ import annotations

from django.tasks import task


@task
def noop() -> None:
    """Do nothing: the task succeeds."""
