"""A competing executor process: poll, start and succeed tasks of definitions through the service
layer until none is left; print the ids it ran and the most tasks it saw in flight, as JSON.

Usage: python -m tests.workers.executor DEFINITION BATCH
Waits for a line on stdin before starting, so that all executors start together.
"""

import json
import sys
from collections import Counter

import django

django.setup()

from django_tasks_coord import executions  # noqa: E402
from django_tasks_coord.enums import IN_FLIGHT  # noqa: E402
from django_tasks_coord.models import Task  # noqa: E402
from tests.api import defs  # noqa: E402,F401  (declares the test definitions)


def in_flight_peak(definition: str) -> int:
    keys = Task.objects.filter(topic_id=definition, state__in=IN_FLIGHT).values_list(
        "concurrency_key", flat=True
    )
    return max(Counter(keys).values(), default=0)


def main() -> None:
    definition, batch = sys.argv[1], int(sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()
    done: list[int] = []
    peak = 0
    empty = 0
    while empty < 3:
        tasks = executions.poll([definition], batch)
        peak = max(peak, in_flight_peak(definition))
        if not tasks:
            if not executions.tasks(definition).exclude(state=40).exists():
                break
            empty += 1 if not executions.tasks(definition, status="ready").exists() else 0
            continue
        empty = 0
        for task in tasks:
            executions.start(task.pk, task.exec_id)
            peak = max(peak, in_flight_peak(definition))
            executions.succeed(task.pk, task.exec_id, {"by": "me"})
            done.append(task.pk)
    print(json.dumps({"done": done, "peak": peak}), flush=True)


if __name__ == "__main__":
    main()
