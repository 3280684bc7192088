"""The chaos run's app (``benchmarks/chaos.py``): the leader-only job and the table of its runs.

- ``models.py``: :class:`~benchmarks.chaosapp.models.LeaderRun`, one row per committed run.
- ``work.py``: the job itself, a module-level callable that records its run inside
  ``ctx.fenced()``, the run's commit point.

Deliberately no ``jobs.py``: the job is scheduled by the chaos script, not declared.
"""
