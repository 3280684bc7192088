"""The no-op ``@task`` for ``benchmarks/django_tasks.py``, run by this project's backend.

Its nodes import it by the dotted path stored with each task
(``benchmarks.benchapp.coord_tasks.noop``).
"""

from __future__ import annotations

from django_tasks_coord.backends.compat import task


@task
def noop() -> None:
    """Do nothing: the task succeeds."""
