"""The fault suite's app (``benchmarks/faults.py``): its workload and what it records.

- ``consumers.py``: the queue consumers (topics ``fq``, the steady stream, and ``burst``) and
  the ``@task`` ``record``; each execution appends a line to its node's execution log
  (:mod:`benchmarks.faultapp.record`) before doing anything else.
- ``work.py`` (not ``jobs.py``: nothing there is declared): the periodic job (any node) and the leader-only job whose commit point is
  ``ctx.fenced()`` (a :class:`~benchmarks.faultapp.models.FencedRun` row).
"""
