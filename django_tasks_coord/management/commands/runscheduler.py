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
from django_tasks_coord.conf import DEFAULTS, app_settings
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


def _help(text: str, setting: str, when_unset: str | None = None) -> str:
    """``text`` and the flag's default: the value of ``TASKS_COORD[setting]`` in force.

    Read when the parser is built (``--help``, or a run), never at import: the value shown is
    the project's own, or the app's default, and ``when_unset`` says what None means.
    """
    try:
        value = getattr(app_settings, setting)
    except ConfigurationError:  # a bad TASKS_COORD: the run reports it; help shows the app's
        value = DEFAULTS[setting]
    shown = when_unset if value is None and when_unset is not None else repr(value)
    if isinstance(value, tuple | list):
        shown = " ".join(map(str, value))
    return f"{text} Default: {shown} (TASKS_COORD['{setting}'])."


VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


class Command(BaseCommand):
    help = (
        "Run a django-tasks-coord node: claim and run due tasks of its topics, heartbeat, "
        "free the work of dead nodes. SIGTERM/SIGINT stop it gracefully; a second signal at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--node-id", help=_help("This node's unique id.", "NODE_ID", "host:pid:random")
        )
        parser.add_argument(
            "--group",
            help=_help("Coordination group for warm backup.", "GROUP", "no group"),
        )
        parser.add_argument(
            "--workers", type=positive_int, help=_help("Worker threads.", "WORKERS")
        )
        parser.add_argument(
            "--topic",
            action="append",
            dest="topics",
            metavar="TOPIC",
            help=_help("Process this topic (repeatable).", "TOPICS", "every topic with a consumer"),
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Process what is due, scheduled jobs included, then exit (default: run until "
            "stopped).",
        )
        parser.add_argument(
            "--batch-size", type=positive_int, help=_help("Tasks per claim query.", "BATCH_SIZE")
        )
        parser.add_argument(
            "--poll-interval",
            type=non_negative_float,
            help=_help("Seconds between polls when idle.", "POLL_INTERVAL"),
        )
        parser.add_argument(
            "--shutdown-max-wait",
            type=non_negative_float,
            help=_help("Seconds running tasks get to finish after SIGTERM.", "SHUTDOWN_MAX_WAIT"),
        )
        parser.add_argument(
            "--metrics-port",
            type=_number(int, 0, "a port number"),
            help=_help(
                "Serve this node's Prometheus metrics on this port ([metrics] extra).",
                "METRICS_PORT",
                "no metrics server",
            ),
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
        metrics = self._metrics_server(node, options["metrics_port"])

        def stop(signum: int, frame: FrameType | None) -> None:
            node.request_stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            code = node.run()
        except DuplicateOwnerError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            if metrics is not None:
                metrics.close()
        if code:
            sys.exit(code)

    def _metrics_server(self, node: Node, port: int | None) -> Any:
        """Start the node's metrics server if a port is given (flag, else setting)."""
        port = app_settings.METRICS_PORT if port is None else port
        if port is None:
            return None
        try:
            from django_tasks_coord.metrics.node import serve

            server = serve(node, int(port), str(app_settings.METRICS_ADDRESS))
        except (ConfigurationError, OSError) as exc:
            raise CommandError(f"Cannot serve metrics on port {port}: {exc}") from exc
        logging.getLogger("django_tasks_coord.metrics").info(
            "Serving this node's metrics on %s:%s/metrics.",
            app_settings.METRICS_ADDRESS,
            server.port,
        )
        return server

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
