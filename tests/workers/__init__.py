"""Scripts run as separate OS processes by multi-process tests (``python -m tests.workers.X``).

They connect to the parent test run's database through the ``TASKS_COORD_TEST_DB``
environment variable (see :func:`tests.processes.subprocess_env`).
"""
