from __future__ import annotations

import atexit
import os
from typing import Any

from django.apps import AppConfig


class IdleBenchConfig(AppConfig):
    name = "benchmarks.benchapp_idle"
    label = "benchapp_idle"
    verbose_name = "Benchmark statement counter"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from benchmarks.benchapp_idle.counter import StatementLog

        path = os.environ.get("BENCH_STATEMENT_LOG")
        if not path:
            return
        log = StatementLog()

        def wrap(sender: Any, connection: Any, **kwargs: Any) -> None:
            if log not in connection.execute_wrappers:
                connection.execute_wrappers.append(log)

        connection_created.connect(wrap, weak=False)
        atexit.register(log.write, path)
