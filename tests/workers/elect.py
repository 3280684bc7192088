"""Race for a group's token: wait for 'go', try to acquire once, print the term won (or 0).

Usage: python -m tests.workers.elect GROUP NODE_ID
"""

import sys
from datetime import timedelta

import django

django.setup()

from django_tasks_coord import coordination  # noqa: E402
from django_tasks_coord.exceptions import TokenBusyError  # noqa: E402


def main() -> None:
    group, node_id = sys.argv[1], sys.argv[2]
    coordination.join(group, node_id)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        term = coordination.try_acquire(group, node_id, timedelta(seconds=30))
    except TokenBusyError:  # another candidate holds the row right now: it decides
        term = None
    print(term or 0, flush=True)


if __name__ == "__main__":
    main()
