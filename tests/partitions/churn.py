"""A worker for the online-conversion test: push, poll and complete until told to stop.

Run as ``python -m tests.partitions.churn TOPIC``. Prints ``ready`` after its first round,
keeps going until a line arrives on stdin, then prints one JSON line: the sequences it
pushed, completed, and deleted (by pushing with ``Insertion.DELETE``).
"""

from __future__ import annotations

import json
import sys
import threading

import django


def main(topic: str) -> None:
    django.setup()
    from django_tasks_coord import queue
    from django_tasks_coord.models import Task

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    pushed: list[int] = []
    completed: list[int] = []
    deleted: list[int] = []
    rounds = 0
    while not stop.is_set() or rounds == 0:
        identifier = f"churn-{rounds % 50}"
        if rounds % 10 == 9:
            # DELETE mode: the identifier's earlier tasks that are not in flight go away.
            doomed = list(
                Task.objects.for_topic(topic)
                .filter(identifier=identifier)
                .exclude(state__in=[20, 30])
                .values_list("sequence", flat=True)
            )
            task = queue.push(topic, identifier, {"round": rounds}, insertion="delete")
            deleted.extend(doomed)
        else:
            task = queue.push(topic, identifier, {"round": rounds})
        pushed.append(task.sequence)
        for claimed in queue.poll(topic, 2):
            queue.complete(claimed, "success")
            completed.append(claimed.sequence)
        if rounds == 0:
            print("ready", flush=True)
        rounds += 1
    print(json.dumps({"pushed": pushed, "completed": completed, "deleted": deleted}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
