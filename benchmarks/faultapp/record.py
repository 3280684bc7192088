"""Each execution's start, appended to a file of its node's (one per process).

A line is ``<time.time()> <pid> <kind> <key> <owner id or ->``, written with one
``os.write`` to a file opened ``O_APPEND`` in ``$FAULTS_EXEC_DIR``, before the execution does
anything else: the kernel keeps it even if the process is killed the next instant, and it
needs no database (a node cut off from the database still records what it starts).
"""

from __future__ import annotations

import os
import threading
import time

_lock = threading.Lock()
_fd: int | None = None


def started(kind: str, key: str, owner_id: int | None) -> None:
    """Record that this process starts execution ``kind``/``key`` for owner ``owner_id``."""
    global _fd
    directory = os.environ.get("FAULTS_EXEC_DIR")
    if not directory:
        return
    with _lock:
        if _fd is None:
            path = os.path.join(directory, f"{os.getpid()}.exec")
            _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    line = f"{time.time():.6f} {os.getpid()} {kind} {key} {owner_id if owner_id else '-'}\n"
    os.write(_fd, line.encode())
