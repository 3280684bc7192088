"""An execute wrapper that logs when each statement ran and which part of the node sent it."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Functions of the package (``module:function``) that name what a statement is for, most
#: specific first: the innermost frame of the stack found here names the statement's kind.
KINDS: dict[str, str] = {
    "owners:heartbeat": "heartbeat (owner)",
    "owners:register_owner": "start/stop",
    "owners:unregister_owner": "start/stop",
    "owners:expire": "reaper: owners.expire",
    "owners:sweep": "reaper: owners.sweep (dead owners, live count)",
    "executions:reap": "reaper: executions.reap",
    "coordination:forget_dead": "reaper: coordination.forget_dead",
    "coordination:heartbeat": "group: membership heartbeat",
    "coordination:join": "group: join",
    "coordination:lease": "group: leader check (lease)",
    "coordination:try_acquire": "group: election (try_acquire)",
    "coordination:leave": "start/stop",
    "scheduler:submit_due": "scheduler: due check (submit_due)",
    "scheduler:next_due": "scheduler: next due (next_due)",
    "watch:look": "dispatcher: work watch (look)",
    "dispatcher:refresh_topics": "dispatcher: topic refresh",
    "dispatcher:claim_round": "dispatcher: claim poll",
    "dispatcher:idle_timeout": "dispatcher: next delayed task",
    "lifeline:status_line": "status line",
    "supervisor:_shutdown": "start/stop",
    "supervisor:_join_group": "start/stop",
    "supervisor:run": "start/stop",
}
PACKAGE = "django_tasks_coord"


def kind_of_caller() -> str:
    """The kind of the statement being executed, from the calling package frames."""
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        path = frame.f_code.co_filename
        if PACKAGE in path:
            module = Path(path).stem
            if module == "__init__":
                module = Path(path).parent.name
            key = f"{module}:{frame.f_code.co_name}"
            if key in KINDS:
                return KINDS[key]
            if fallback is None and module not in ("db", "models"):
                fallback = f"other: {key}"
        frame = frame.f_back  # type: ignore[assignment]
    return fallback or "other"


class StatementLog:
    """Execute wrapper: records (wall time, kind, verb) of every statement, thread-safely."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: list[tuple[float, str, str]] = []

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        kind = kind_of_caller()
        verb = sql.split(maxsplit=1)[0].upper() if sql.strip() else "?"
        with self.lock:
            self.rows.append((time.time(), kind, verb))
        return execute(sql, params, many, context)

    def write(self, path: str) -> None:
        """Write the log as JSON (called at exit)."""
        with self.lock:
            rows = list(self.rows)
        Path(path).write_text(json.dumps(rows))
