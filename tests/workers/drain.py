"""Drain a topic: poll batches, complete each task, print the sequences completed as JSON.

Usage: python -m tests.workers.drain TOPIC BATCH
Waits for a line on stdin before starting, so that all workers start together; after its
first claim it prints ``claimed N`` and waits for another line, so that the test can hold
every worker's first claim open at once (the work is then shared by construction, and the
claims that follow still race).
"""

import json
import sys

import django

django.setup()

from django_tasks_coord import queue  # noqa: E402


def main() -> None:
    topic, batch = sys.argv[1], int(sys.argv[2])
    owner = queue.register_owner()
    print("ready", flush=True)
    sys.stdin.readline()
    done: list[int] = []
    empty = 0
    first = True
    while empty < 3:
        tasks = queue.poll(topic, batch, owner=owner)
        if first:
            first = False
            print(f"claimed {len(tasks)}", flush=True)
            sys.stdin.readline()
        if not tasks:
            empty += 1
            continue
        empty = 0
        for task in tasks:
            queue.complete(task, queue.Decision.success(message=owner.name))
            done.append(task.sequence)
    queue.unregister_owner(owner)
    print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
