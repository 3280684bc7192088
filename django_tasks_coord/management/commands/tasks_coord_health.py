"""``manage.py tasks_coord_health``: exit 0 when a node is alive (see :mod:`django_tasks_coord.health`)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_tasks_coord import health
from django_tasks_coord.exceptions import ConfigurationError
from django_tasks_coord.management.commands._arguments import number

_positive_seconds = number(float, 0, "a number", exclusive=True)
_pid = number(int, 1, "a process id")


class Command(BaseCommand):
    help = (
        "Health check for container probes: exit 0 when the database answers and the node's "
        "heartbeat is fresh; otherwise print one line and exit 3 (database unavailable), "
        "4 (node not registered), 5 (heartbeat too old) or 6 (several nodes: name one)."
    )
    # A probe must be quick and must not fail on a system check's findings.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--node-id",
            help="The node to check (default: TASKS_COORD['NODE_ID'], else the node "
            "running on this host).",
        )
        parser.add_argument(
            "--pid",
            type=_pid,
            help="Without a node id: the process id of the node on this host.",
        )
        parser.add_argument(
            "--max-age",
            type=_positive_seconds,
            metavar="SECONDS",
            help="The oldest acceptable heartbeat (default: TASKS_COORD['LIVENESS_INTERVAL']).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = health.check(
                options["node_id"], pid=options["pid"], max_age=options["max_age"]
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        if not report.healthy:
            raise CommandError(f"unhealthy: {report.reason}", returncode=int(report.status))
        if options["verbosity"] > 0:
            self.stdout.write(f"healthy: {report.reason}")
