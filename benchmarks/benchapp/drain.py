"""Fill and read the throughput drain's queue with whichever package is on the path.

``benchmarks/paired.py`` runs it as a subprocess of each version it compares, so that each
version writes and reads its own database with its own code::

    python -m benchmarks.benchapp.drain fill 5000   # empty the task table, push 5000 no-ops
    python -m benchmarks.benchapp.drain read        # JSON: finished, first start, last finish
    python -m benchmarks.benchapp.drain fill-tasks 5000   # 5000 no-op @task tasks instead
    python -m benchmarks.benchapp.drain read --topic default

Needs ``DJANGO_SETTINGS_MODULE=benchmarks.settings`` and ``BENCH_DATABASE`` (and, for the
``@task`` tasks, ``BENCH_TASKS_BACKEND=1``). It uses only what every version keeps
(``queue.register_topic``, ``queue.push_many``, Django's ``enqueue()``, the ``Task`` and
``Owner`` models), so it runs on the package before and after a change alike.
"""

from __future__ import annotations

import argparse
import json

TOPIC = "noop"  # the topic of benchapp.consumers.noop, as in benchmarks/throughput.py
TASKS_TOPIC = "default"  # the queue of benchapp.coord_tasks.noop
CHUNK = 1000


def fill(count: int) -> None:
    """Empty the task and owner tables; push ``count`` no-op tasks, then refresh statistics."""
    from benchmarks import common
    from django_tasks_coord import queue
    from django_tasks_coord.models import Owner, Task

    queue.register_topic(TOPIC)
    Task.objects.all().delete()
    Owner.objects.all().delete()
    for start in range(0, count, CHUNK):
        stop = min(count, start + CHUNK)
        queue.push_many(TOPIC, [(f"task-{i}", None) for i in range(start, stop)])
    common.tidy("default", Task._meta.db_table)


def fill_tasks(count: int) -> None:
    """Empty the task and owner tables; then ``count`` copies of one ``noop.enqueue()``'s row
    (its payload and handler, each with its own id), ``push_many`` 1,000 at a time."""
    from benchmarks import common
    from benchmarks.benchapp.coord_tasks import noop
    from django_tasks_coord import queue
    from django_tasks_coord.models import Owner, Task

    Task.objects.all().delete()
    Owner.objects.all().delete()
    model = Task.objects.get(identifier=noop.enqueue().id)
    Task.objects.all().delete()
    for start in range(0, count, CHUNK):
        items = [(f"t{i}", model.payload) for i in range(start, min(count, start + CHUNK))]
        queue.push_many(TASKS_TOPIC, items, handler=model.handler)
    common.tidy("default", Task._meta.db_table)


def read(topic: str = TOPIC) -> dict[str, object]:
    """How many tasks succeeded, the first start and the last finish; the package's path."""
    from django.db.models import Count, Max, Min, Q

    import django_tasks_coord
    from django_tasks_coord.enums import TaskState
    from django_tasks_coord.models import Task

    row = Task.objects.filter(topic_id=topic).aggregate(
        done=Count("pk", filter=Q(state=TaskState.SUCCEEDED)),
        first=Min("started_at"),
        last=Max("finished_at"),
    )
    return {
        "done": row["done"],
        "first": row["first"].isoformat() if row["first"] else None,
        "last": row["last"].isoformat() if row["last"] else None,
        "package": django_tasks_coord.__file__,
    }


def main() -> None:
    import django

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fill").add_argument("count", type=int)
    commands.add_parser("fill-tasks").add_argument("count", type=int)
    commands.add_parser("read").add_argument("--topic", default=TOPIC)
    args = parser.parse_args()
    django.setup()
    if args.command == "fill":
        fill(args.count)
    elif args.command == "fill-tasks":
        fill_tasks(args.count)
    else:
        print(json.dumps(read(args.topic)))


if __name__ == "__main__":
    main()
