"""The benchmark's app: no-op work for every system ``benchmarks/throughput.py`` measures.

- ``consumers.py``: this project's consumers (topics ``noop`` and ``latency``), found by
  ``runscheduler`` like any app's ``consumers.py``.
- ``peer_tasks.py``: the same no-op as a ``django.tasks`` task (for django-tasks-db) and as
  a procrastinate task. Imported only in the peers' virtualenv.

Nothing here imports Django or a peer at package import time.
"""
