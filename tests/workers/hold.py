"""Register an owner, claim tasks, report them and then hang (waiting to be killed).

Usage: python -m tests.workers.hold OWNER_NAME TOPIC LIMIT
"""

import json
import sys

import django

django.setup()

from django_tasks_coord import queue  # noqa: E402


def main() -> None:
    name, topic, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    owner = queue.register_owner(name)
    tasks = queue.poll(topic, limit, owner=owner)
    print(json.dumps([t.sequence for t in tasks]), flush=True)
    sys.stdin.readline()  # hold the tasks until killed


if __name__ == "__main__":
    main()
