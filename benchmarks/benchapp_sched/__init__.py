"""Job functions for ``benchmarks/scheduling.py``.

Not an installed app: the nodes import ``benchapp_sched.jobs`` by the dotted path stored
with each schedule (``benchmarks.benchapp_sched.jobs.stamp``), like any job. Nothing here
imports Django at package import time.
"""
