"""``manage.py runscheduler``: run one node (see :mod:`django_tasks_coord.node`)."""

from __future__ import annotations

import gc
import logging
import queue
import signal
import sys
import threading
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_tasks_coord import db, definitions, handlers
from django_tasks_coord.conf import DEFAULTS, app_settings
from django_tasks_coord.exceptions import ConfigurationError, DuplicateOwnerError
from django_tasks_coord.management.commands._arguments import (
    non_negative_float,
    number,
    positive_int,
)
from django_tasks_coord.node import Node, NodeConfig
from django_tasks_coord.scheduling import declared


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

logger = logging.getLogger(__name__)


class StopSignals:
    """SIGTERM and SIGINT for the whole life of the command, start-up included.

    Until the node exists (system checks, loading consumers and jobs) a signal is
    remembered, and the command exits cleanly at the next step (:meth:`stop_requested`)
    before registering anything; a second one exits at once (nothing is registered yet).
    Once the node exists, a signal is its :meth:`~django_tasks_coord.node.Node.request_stop`,
    made by a thread of its own (``stop-signals``): the handler runs in the main thread
    between two bytecodes of whatever it interrupted, which may hold a lock that the request
    takes (a loop's wake-up event, cleared by the dispatcher every round; a ``Lock`` is not
    reentrant: the main thread would wait for itself). The handler only hands the signal to
    that thread through a :class:`queue.SimpleQueue`, whose ``put`` is safe there. The
    previous handlers come back when the command ends.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.node: Node | None = None
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._relayed: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._relay: threading.Thread | None = None

    def install(self) -> None:
        """Handle the signals (only the main thread can; elsewhere, e.g. ``call_command``
        from a thread, the process keeps its handlers)."""
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Put the previous handlers back (and end the thread that relays signals)."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if self._relay is not None:
            self._relayed.put(None)
            self._relay.join(timeout=5)
            self._relay = None

    def attach(self, node: Node) -> None:
        """From now on signals stop ``node`` (at once if one came already)."""
        self._relay = threading.Thread(target=self._relay_signals, name="stop-signals", daemon=True)
        self._relay.start()
        self.node = node
        if self.received is not None:
            node.request_stop()

    def _relay_signals(self) -> None:
        """The ``stop-signals`` thread: each signal the handler hands over stops the node."""
        while (signum := self._relayed.get()) is not None:
            assert self.node is not None
            logger.debug("%s received.", signal.Signals(signum).name)
            self.node.request_stop()  # its message is logged as the node shuts down

    def stop_requested(self) -> bool:
        """Whether a signal came during start-up (logged here: the node never registered)."""
        if self.received is None:
            return False
        logger.info(
            "%s received during start-up: exiting before the node registered.",
            signal.Signals(self.received).name,
        )
        return True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.node is not None:
            self._relayed.put(signum)  # no lock here: the stop-signals thread stops the node
        elif self.received is None:
            self.received = signum
        else:  # a second signal during start-up: nothing is registered, leave now
            raise SystemExit(0)


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
            type=number(int, 0, "a port number"),
            help=_help(
                "Serve this node's Prometheus metrics on this port ([metrics] extra).",
                "METRICS_PORT",
                "no metrics server",
            ),
        )

    def run_from_argv(self, argv: list[str]) -> None:
        """Run from the command line; the process exits when this returns.

        Once the node has stopped, the interpreter's last garbage collections would walk
        every object the process loaded (Django, the project, this package): most of a
        second on a loaded machine. Those objects are frozen (:func:`gc.freeze`) instead,
        so the process exits as soon as the node has stopped. Exit handlers still run.
        """
        try:
            super().run_from_argv(argv)
        finally:
            gc.freeze()

    def execute(self, *args: Any, **options: Any) -> Any:
        """Handle SIGTERM/SIGINT from before the system checks to the end (:class:`StopSignals`).

        A database that does not answer yet (it is starting too, or restarting) is waited
        for, with back-off and one WARNING, before the system checks (some of which, on
        MariaDB/MySQL, query it): a signal meanwhile ends the command cleanly.
        """
        self._signals = stops = StopSignals()
        stops.install()
        try:
            self._configure_logging(options.get("verbosity", 1))
            if not db.wait_for_database(
                "Start-up: waiting for the database", stopped=lambda: stops.received is not None
            ):
                stops.stop_requested()  # logs why
                return None
            return super().execute(*args, **options)
        finally:
            stops.restore()

    def handle(self, *args: Any, **options: Any) -> None:
        stops: StopSignals = getattr(self, "_signals", None) or StopSignals()
        self._configure_logging(options["verbosity"])
        logger.info("Starting: loading consumers, task definitions and jobs.")
        handlers.autodiscover()
        if stops.stop_requested():
            return
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
        if config.scheduler:  # the jobs consumer is registered by the app's ready()
            declared.autodiscover()
            if stops.stop_requested():
                return
            declared.sync_declared()
        if stops.stop_requested():
            return
        node = Node(config)
        metrics = self._metrics_server(node, options["metrics_port"])
        stops.attach(node)  # a signal from now on (or one that came just now) stops the node
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
        """Start the node's metrics server if a port is given (flag, else setting).

        :mod:`django_tasks_coord.metrics.node` is imported here, not at the top: it needs
        the optional ``[metrics]`` extra, and refuses to import without it.
        """
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
