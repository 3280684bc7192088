"""A worker for the registration race: register topics, push to each, print JSON.

Run as ``python -m tests.partitions.register`` (see ``tests.processes.run_together``):
prints ``ready``, waits for a line on stdin, then registers ``worker<pid>-0`` ...
``worker<pid>-4`` and ``shared-0`` ... ``shared-4``
(interleaved, so every worker also races the others for the shared ones) and pushes one
task to each.
"""

from __future__ import annotations

import json
import os
import sys

import django


def main() -> None:
    django.setup()
    from django_tasks_coord import queue

    print("ready", flush=True)
    sys.stdin.readline()
    pushed, prefix = [], f"worker{os.getpid()}"
    for i in range(5):
        for name in (f"{prefix}-{i}", f"shared-{i}"):
            queue.register_topic(name)
            pushed.append(queue.push(name, prefix).sequence)
    print(json.dumps({"pushed": pushed}), flush=True)


if __name__ == "__main__":
    main()
