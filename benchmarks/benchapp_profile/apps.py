"""The profile app's ``AppConfig`` (see the package docstring)."""

from __future__ import annotations

import atexit
import collections
import json
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from django.apps import AppConfig

#: Thread names without their number: "worker-3" counts as "worker".
_NUMBER = re.compile(r"-\d+$")


def _kind() -> str:
    return _NUMBER.sub("", threading.current_thread().name)


class Profile:
    """What one node did: statements and connections per thread kind, CPU per thread kind."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statements: collections.Counter[tuple[str, str]] = collections.Counter()
        self.connections: collections.Counter[str] = collections.Counter()
        self.cpu: collections.Counter[str] = collections.Counter()

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        words = sql.split(None, 3)
        statement = " ".join(words[:1] + [w for w in words[1:3] if w.isupper()])
        with self.lock:
            self.statements[(_kind(), statement)] += 1
        return execute(sql, params, many, context)

    def write(self, path: str) -> None:
        self.cpu["MainThread"] += time.thread_time()
        import django_tasks_coord

        document = {
            "package": django_tasks_coord.__file__,
            "statements": [[k, s, n] for (k, s), n in self.statements.most_common()],
            "connections": dict(self.connections),
            "cpu_s": {kind: round(seconds, 4) for kind, seconds in self.cpu.items()},
        }
        with open(path, "w") as out:
            json.dump(document, out)


class ProfileBenchConfig(AppConfig):
    name = "benchmarks.benchapp_profile"
    label = "benchapp_profile"
    verbose_name = "Benchmark node profile"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        path = os.environ.get("BENCH_PROFILE_LOG")
        if not path:
            return
        profile = Profile()
        bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

        def timed(thread: threading.Thread) -> None:
            try:
                bootstrap(thread)
            finally:
                with profile.lock:
                    profile.cpu[_NUMBER.sub("", thread.name)] += time.thread_time()

        threading.Thread._bootstrap_inner = timed  # type: ignore[attr-defined]

        def wrap(sender: Any, connection: Any, **kwargs: Any) -> None:
            with profile.lock:
                profile.connections[_kind()] += 1
            if profile not in connection.execute_wrappers:
                connection.execute_wrappers.append(profile)

        connection_created.connect(wrap, weak=False)
        atexit.register(profile.write, path)
