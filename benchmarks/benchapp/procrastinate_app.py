"""The no-op task for procrastinate, imported in the peers' virtualenv only.

The worker is procrastinate's own CLI::

    procrastinate --app=benchmarks.benchapp.procrastinate_app.app worker --concurrency 8 --one-shot

``BENCH_PROCRASTINATE_DSN`` (a libpq connection string) names the database. The task is a
coroutine: procrastinate runs coroutines on its event loop and plain functions in a thread
pool, so this is procrastinate's fastest path for a no-op.
"""

from __future__ import annotations

import os

from procrastinate import App, PsycopgConnector

app = App(
    connector=PsycopgConnector(
        conninfo=os.environ.get("BENCH_PROCRASTINATE_DSN", ""),
        # Enough connections for 8 concurrent jobs plus the listener (the default pool has 4).
        min_size=int(os.environ.get("BENCH_PROCRASTINATE_POOL", "10")),
        max_size=int(os.environ.get("BENCH_PROCRASTINATE_POOL", "10")),
    )
)


@app.task(name="noop", queue="bench")
async def noop() -> None:
    """Do nothing: the job succeeds."""
