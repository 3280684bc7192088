"""``manage.py runscheduler``: run one node (see :mod:`django_tasks_coord.node`)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_tasks_coord import definitions, handlers
from django_tasks_coord.exceptions import ConfigurationError, DuplicateOwnerError
from django_tasks_coord.node import Node, NodeConfig


def _number(kind: Callable[[str], float], minimum: float, what: str) -> Callable[[str], Any]:
    """An argparse type converting with ``kind`` and refusing values below ``minimum``."""

    def convert(value: str) -> float:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{value!r} must be at least {minimum}")
        return number

    return convert


positive_int = _number(int, 1, "an integer")
non_negative_float = _number(float, 0, "a number")


VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


class Command(BaseCommand):
    help = (
        "Run a django-tasks-coord node: claim and run due tasks of its topics, heartbeat, "
        "free the work of dead nodes. SIGTERM/SIGINT stop it gracefully; a second signal at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--node-id", help="This node's unique id (default: host:pid:random).")
        parser.add_argument(
            "--group", help="Coordination group for warm backup (TASKS_COORD['GROUP'])."
        )
        parser.add_argument(
            "--workers", type=positive_int, help="Worker threads (TASKS_COORD['WORKERS'])."
        )
        parser.add_argument(
            "--topic",
            action="append",
            dest="topics",
            metavar="TOPIC",
            help="Process this topic (repeatable; default: every topic with a consumer).",
        )
        parser.add_argument("--burst", action="store_true", help="Process what is due, then exit.")
        parser.add_argument("--batch-size", type=positive_int, help="Tasks per claim query.")
        parser.add_argument(
            "--poll-interval", type=non_negative_float, help="Seconds between polls when idle."
        )
        parser.add_argument(
            "--shutdown-max-wait",
            type=non_negative_float,
            help="Seconds running tasks get to finish after SIGTERM.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        handlers.autodiscover()
        definitions.prepare()  # task definitions: their rows and topics, for the reaper too
        try:
            config = NodeConfig.from_settings(
                node_id=options["node_id"],
                group=options["group"],
                workers=options["workers"],
                topics=options["topics"],
                batch_size=options["batch_size"],
                poll_interval=options["poll_interval"],
                shutdown_max_wait=options["shutdown_max_wait"],
                burst=options["burst"],
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        if config.scheduler:
            from django_tasks_coord.scheduling import declared, runner  # noqa: F401  (jobs consumer)

            declared.autodiscover()
            declared.sync_declared()
        node = Node(config)

        def stop(signum: int, frame: FrameType | None) -> None:
            node.request_stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            code = node.run()
        except DuplicateOwnerError as exc:
            raise CommandError(str(exc)) from exc
        if code:
            sys.exit(code)

    def _configure_logging(self, verbosity: int) -> None:
        package = logging.getLogger("django_tasks_coord")
        package.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.DEBUG))
        if not package.handlers:  # the project did not configure this package's logging
            handler = logging.StreamHandler(sys.stdout)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            package.addHandler(handler)
            package.propagate = False
