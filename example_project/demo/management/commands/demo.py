"""``manage.py demo``: set everything up, start the processes of a small deployment, and
stop them all on Ctrl-C.

It migrates, creates the superuser ``demo`` (password ``demo``) and an API token, schedules
the recurring ``demo-countdown`` job, enqueues a Django task, then starts and watches:

- two ``runscheduler`` nodes, ``demo-a`` and ``demo-b``, in coordination group ``demo``
  (both process the queues and jobs; the leader also runs the leader-only ``demo-ledger``);
- ``web``: uvicorn serving the admin and the HTTP API (ASGI, for the API's long-polls);
- ``executor``: example_project/executor.py, running ``demo/thumbnail`` tasks over HTTP.

The children run in process groups of their own, so a Ctrl-C reaches this process only; it
stops the executor first, then the web server and the nodes (each gracefully, by SIGINT),
waits for them, kills what does not stop in time, and exits 0 when every child stopped
cleanly. On Linux the children also get SIGTERM if this process dies without cleaning up.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, connections

from demo.consumers import TOPIC
from demo.jobs import GROUP, countdown
from demo.tasks import word_count
from django_tasks_coord import queue, scheduling
from django_tasks_coord.api.auth import issue_token
from django_tasks_coord.models import ApiToken

USERNAME = PASSWORD = "demo"
TOKEN_NAME = "demo executor"
NODES = ("demo-a", "demo-b")
COUNTDOWN = "demo-countdown"


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    relay: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Command(BaseCommand):
    help = (
        "Run the django-tasks-coord demo: two nodes, the admin and HTTP API, an external "
        "executor, and work of every kind (SQLite by default; set DATABASE_URL for another "
        "database). Ctrl-C stops everything."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port",
            type=int,
            help="Port of the admin and the HTTP API (default 8000, or a free one if it is taken).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._lock = threading.Lock()
        self._signals = 0
        self._stop = threading.Event()
        port = self._port(options["port"])
        token = self._set_up()
        base = f"http://127.0.0.1:{port}"
        children = self._children(port, token)
        connections.close_all()  # the children do the work from here on

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        failed: str | None = None
        for child in children:
            if child.name == "executor" and not self._wait_for(f"{base}/tasks/openapi.json"):
                failed = None if self._signals else "the web server did not answer"
                break
            self._start(child)
        else:
            self._banner(base, token, children)
        running = [child for child in children if child.proc is not None]
        lost: list[Child] = []
        while failed is None and not self._stop.wait(0.5):
            for child in [c for c in running if not c.running]:
                running.remove(child)
                lost.append(child)
                status = child.proc.returncode  # type: ignore[union-attr]
                if child.name in NODES and any(c.name in NODES for c in running):
                    self.say(f"{child.name} exited with status {status}; the other node goes on.")
                else:
                    failed = f"{child.name} exited with status {status}"
                    self.say(f"{failed}; stopping.")
        clean = self._shut_down(running)
        if failed is not None or not clean:
            raise CommandError("The demo did not stop cleanly (see above).")
        if lost:
            gone = ", ".join(f"{c.name} ({c.proc.returncode})" for c in lost)  # type: ignore[union-attr]
            self.say(f"Demo stopped: the other processes exited cleanly; exited earlier: {gone}.")
        else:
            self.say("Demo stopped: every process exited cleanly.")

    # -- setting up ---------------------------------------------------------------------

    def _set_up(self) -> str:
        self.say(f"Database: {_describe(connection.settings_dict)}")
        call_command("migrate", interactive=False, verbosity=0)
        user_model = get_user_model()
        user, _ = user_model.objects.get_or_create(
            username=USERNAME, defaults={"is_staff": True, "is_superuser": True}
        )
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(PASSWORD)
        user.save()
        ApiToken.objects.filter(user=user, name=TOKEN_NAME).delete()  # one token per run
        _, token = issue_token(user, TOKEN_NAME)
        queue.register_topic(TOPIC)
        # A recurring job with max_count, scheduled at run time: five runs, 3 s apart.
        # Scheduling the same id again (the next `manage.py demo`) starts its count afresh.
        scheduling.schedule_recurring(countdown, 3, max_count=5, job_id=COUNTDOWN)
        result = word_count.enqueue("hello from manage.py demo, hello from Django's task API")
        self.say(
            f"Migrated; superuser {USERNAME!r}; job {COUNTDOWN!r} scheduled; "
            f"Django task {result.id} enqueued."
        )
        return token

    def _port(self, wanted: int | None) -> int:
        if wanted is not None:
            if not _free(wanted):
                raise CommandError(f"Port {wanted} is taken.")
            return wanted
        if _free(8000):
            return 8000
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])

    def _children(self, port: int, token: str) -> list[Child]:
        manage = str(settings.BASE_DIR / "manage.py")
        python = sys.executable
        nodes = [
            Child(node, [python, manage, "runscheduler", "--group", GROUP, "--node-id", node])
            for node in NODES
        ]
        web = Child(
            "web",
            [
                python,
                "-m",
                "uvicorn",
                "example_project.asgi:application",
                f"--app-dir={settings.BASE_DIR}",
                "--host=127.0.0.1",
                f"--port={port}",
                "--lifespan=off",
                "--no-access-log",
                "--log-level=warning",
                "--timeout-graceful-shutdown=3",
            ],
        )
        executor = Child(
            "executor",
            [python, str(settings.BASE_DIR / "executor.py")],
            {"TASKS_API_URL": f"http://127.0.0.1:{port}/tasks", "TASKS_API_TOKEN": token},
        )
        return [*nodes, web, executor]

    # -- processes ------------------------------------------------------------------------

    def _start(self, child: Child) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **child.env}
        child.proc = subprocess.Popen(
            child.argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,  # Ctrl-C in the terminal reaches this process, not the children
            preexec_fn=_die_with_parent,
        )
        child.relay = threading.Thread(target=self._relay, args=(child,), daemon=True)
        child.relay.start()

    def _relay(self, child: Child) -> None:
        """Copy a child's output to ours, each line prefixed with the child's name."""
        assert child.proc is not None
        assert child.proc.stdout is not None
        for raw in child.proc.stdout:
            self.say(f"{child.name:>8} | {raw.decode(errors='replace').rstrip()}", style=False)

    def _wait_for(self, url: str, timeout: float = 60.0) -> bool:
        """Wait until ``url`` answers (the web server is up); False on a signal or a timeout."""
        deadline = time.monotonic() + timeout
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return True
            except OSError:
                self._stop.wait(0.2)
        if not self._stop.is_set():
            self.say(f"{url} did not answer within {timeout:.0f}s.")
        return False

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signals += 1
        self._stop.set()

    def _shut_down(self, children: list[Child]) -> bool:
        """Stop the executor, then the rest; True if every child exited with status 0."""
        self.say("Stopping (a second Ctrl-C kills what is still running)...")
        signalled = self._signals
        executor = [c for c in children if c.name == "executor"]
        others = [c for c in children if c.name != "executor"]
        node_grace = float(settings.TASKS_COORD["SHUTDOWN_MAX_WAIT"]) + 15
        for batch, grace in ((executor, 5.0), (others, node_grace)):
            for child in batch:
                if child.running:
                    child.proc.send_signal(signal.SIGINT)  # type: ignore[union-attr]
            deadline = time.monotonic() + grace
            while any(c.running for c in batch) and time.monotonic() < deadline:
                if self._signals > signalled:
                    break  # another Ctrl-C: wait no longer
                time.sleep(0.1)
        clean = True
        for child in children:
            assert child.proc is not None
            if child.running:
                self.say(f"{child.name} did not stop in time: killed.")
                child.proc.kill()
                clean = False
            child.proc.wait()
            if child.relay is not None:
                child.relay.join(timeout=5)
            if child.proc.returncode != 0:
                self.say(f"{child.name} exited with status {child.proc.returncode}.")
                clean = False
        return clean

    # -- output ---------------------------------------------------------------------------

    def say(self, text: str, *, style: bool = True) -> None:
        with self._lock:
            self.stdout.write(self.style.MIGRATE_HEADING(text) if style else text)
            self.stdout.flush()

    def _banner(self, base: str, token: str, children: list[Child]) -> None:
        pids = ", ".join(f"{c.name} (pid {c.proc.pid})" for c in children if c.proc)
        manage = "python example_project/manage.py"
        self.say(
            "\n".join(
                [
                    "",
                    "django-tasks-coord demo is running.",
                    f"  Admin:     {base}/admin/   user {USERNAME!r}, password {PASSWORD!r}",
                    f"  HTTP API:  {base}/tasks/   token {token}",
                    f"  Processes: {pids}",
                    "  Work:      topic 'emails' (consumer demo.consumers.deliver); jobs "
                    "'demo-feed' (calendar '*:*:0/5'), 'demo-countdown' (every 3 s, max_count=5),",
                    "             'demo-ledger' (leader of group 'demo' only); Django task "
                    "demo.tasks.word_count; definition 'demo/thumbnail' (executor.py).",
                    "  Try:       kill -9 the leading node (Admin > Token holders shows it): "
                    "the other node takes over within 10 s.",
                    f"             {manage} tasks_coord_health --node-id demo-a",
                    "Press Ctrl-C to stop.",
                    "",
                ]
            )
        )


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _describe(db: dict[str, Any]) -> str:
    engine = db["ENGINE"].rsplit(".", 1)[-1]
    if engine == "sqlite3":
        return f"SQLite {db['NAME']}"
    return f"{engine} {db.get('HOST') or 'localhost'}:{db.get('PORT') or '-'}/{db['NAME']}"


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the demo process dies (Linux only)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)
