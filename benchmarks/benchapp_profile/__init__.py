"""Where a ``runscheduler`` node spends its CPU and its statements, for ``benchmarks/task_profile.py``.

Installed by ``benchmarks.settings`` with ``BENCH_APP=benchapp_profile`` (the node runs
Django ``@task`` no-ops, imported by their dotted path, so it needs no other app). Its
``ready()`` counts every SQL statement each thread of the node sends (an execute wrapper on
each connection, by thread kind and statement kind), counts the connections each thread
kind opens, and notes each thread's CPU time (``time.thread_time()``) when it ends; at exit
it writes them as JSON to the file named by ``BENCH_PROFILE_LOG``.
"""
