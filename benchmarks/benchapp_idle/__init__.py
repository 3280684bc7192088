"""Counts the SQL statements of a ``runscheduler`` node, for ``benchmarks/idle_load.py``.

Installed (``INSTALLED_APPS``) by ``benchmarks.settings`` with ``BENCH_APP=benchapp_idle`` only. Its ``ready()`` adds
:class:`~benchmarks.benchapp_idle.counter.StatementLog` as an execute wrapper to every
database connection the node opens (one per thread), and writes the log to the file named
by ``BENCH_STATEMENT_LOG`` when the process exits.
"""
