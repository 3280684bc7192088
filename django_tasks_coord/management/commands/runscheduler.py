"""``manage.py runscheduler``: run one node (see :mod:`django_tasks_coord.node`)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_tasks_coord import handlers
from django_tasks_coord.exceptions import ConfigurationError, DuplicateOwnerError
from django_tasks_coord.node import Node, NodeConfig


def positive_int(value: str) -> int:
    """argparse type: an int of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return number


def non_negative_float(value: str) -> float:
    """argparse type: seconds, zero or more."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    return number


VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


class Command(BaseCommand):
    help = (
        "Run a django-tasks-coord node: claim and run due tasks of its topics, heartbeat, "
        "free the work of dead nodes. SIGTERM/SIGINT stop it gracefully; a second signal at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--node-id", help="This node's unique id (default: host:pid:random).")
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
        try:
            config = NodeConfig.from_settings(
                node_id=options["node_id"],
                workers=options["workers"],
                topics=options["topics"],
                batch_size=options["batch_size"],
                poll_interval=options["poll_interval"],
                shutdown_max_wait=options["shutdown_max_wait"],
                burst=options["burst"],
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
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
