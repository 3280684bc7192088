"""Database outages for tests and benchmarks: cut every connection, or restart a private server.

The shared database servers are never stopped: :func:`terminate_connections` ends the
connections other sessions hold to one database (``pg_terminate_backend``, MariaDB/MySQL
``KILL CONNECTION``), and :class:`PrivatePostgres` is a PostgreSQL cluster of its own
(``initdb`` in a temporary directory, on a free loopback port) that can be restarted, and
:class:`PrivateMariaDB` likewise a ``mariadbd`` of its own.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def terminate_connections(cursor: Any, vendor: str) -> int:
    """End every connection to the cursor's database but the cursor's own; return how many.

    PostgreSQL: ``pg_terminate_backend`` of each backend of ``current_database()``.
    MariaDB/MySQL: ``KILL CONNECTION`` of each connection of ``DATABASE()`` listed in
    ``information_schema.processlist`` (one that ended meanwhile is skipped).
    """
    if vendor == "postgresql":
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])
    if vendor == "mysql":
        cursor.execute(
            "SELECT id FROM information_schema.processlist "
            "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
        )
        killed = 0
        for (pid,) in cursor.fetchall():
            try:
                cursor.execute(f"KILL CONNECTION {int(pid)}")
            except Exception:  # noqa: BLE001 - it ended meanwhile (unknown thread id)
                continue
            killed += 1
        return killed
    raise ValueError(f"{vendor} has no connections to terminate.")


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def postgres_bin() -> Path | None:
    """The directory of PostgreSQL's server programs (``initdb``, ``pg_ctl``), if installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _version(path: str) -> tuple[int, ...]:
    part = Path(path).parent.parent.name
    return tuple(int(x) for x in part.split(".") if x.isdigit())


class PrivateServer:
    """A database server of a test's or benchmark's own, which it may stop and start."""

    def start(self) -> float:
        """Start the server; return ``time.monotonic()`` once it accepts connections."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the server, ending every connection."""
        raise NotImplementedError

    def restart(self, down: float = 0.0) -> float:
        """Stop, stay down ``down`` seconds, start; return when it accepts connections again."""
        self.stop()
        if down:
            time.sleep(down)  # the outage itself
        return self.start()


class PrivatePostgres(PrivateServer):
    """A PostgreSQL cluster owned by one test or benchmark, which may stop and start it.

    ``initdb`` refuses to run as root: as root, the cluster belongs to the ``postgres``
    user and its programs run through ``runuser``. Authentication is ``trust`` for the
    superuser ``root`` on 127.0.0.1 only. Always call :meth:`destroy` (a fixture's
    teardown): it stops the server and removes its directory.
    """

    def __init__(self) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise FileNotFoundError("PostgreSQL's server programs (initdb, pg_ctl) are missing.")
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tasks_coord_pg_"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                raise FileNotFoundError("runuser is missing: initdb cannot run as root.")
            shutil.chown(self.root, "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-U", "root", "--auth=trust", "-E", "UTF8")

    def _run(self, program: str, *args: str) -> None:
        command = [*self._as, str(self.bindir / program), *args]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def settings(self, name: str) -> dict[str, Any]:
        """Django ``DATABASES`` entry for database ``name`` on this server."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": "root",
            "PASSWORD": "",
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "OPTIONS": {},
        }

    def start(self) -> float:
        """Start the server; return ``time.monotonic()`` once it accepts connections."""
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        return time.monotonic()

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: every connection is ended, like a restart does)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def create_database(self, name: str) -> None:
        """``CREATE DATABASE name`` (the server must be running)."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="root", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def destroy(self) -> None:
        """Stop the server if it runs (immediately), and remove its directory."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateMariaDB(PrivateServer):
    """A ``mariadbd`` of a test's or benchmark's own: a temporary data directory, a free port.

    ``mariadb-install-db`` makes the data directory; the server runs as the current user,
    without binary log, on 127.0.0.1 only. Always call :meth:`destroy`.
    """

    def __init__(self) -> None:
        if not (shutil.which("mariadbd") or Path("/usr/sbin/mariadbd").exists()):
            raise FileNotFoundError("mariadbd is missing")
        self.binary = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tasks_coord_mariadb_"))
        self.data = self.root / "data"
        self.socket = self.root / "mariadb.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={self.data}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )

    def settings(self, name: str) -> dict[str, Any]:
        """Django ``DATABASES`` entry for database ``name`` on this server."""
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": name,
            "USER": "root",
            "PASSWORD": "",
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
        }

    def start(self) -> float:
        """Start the server; return ``time.monotonic()`` once it accepts connections."""
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--no-defaults",
                f"--datadir={self.data}",
                f"--port={self.port}",
                f"--socket={self.socket}",
                "--bind-address=127.0.0.1",
                "--user=root",
                "--skip-log-bin",
                "--innodb-flush-log-at-trx-commit=2",
                "--max-connections=200",
                f"--log-error={self.root / 'error.log'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import MySQLdb

        deadline = time.monotonic() + 60
        while True:
            try:
                MySQLdb.connect(host="127.0.0.1", port=self.port, user="root").close()
                return time.monotonic()
            except MySQLdb.OperationalError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.02)  # polling the server's port until it answers

    def stop(self) -> None:
        """Stop the server (SIGTERM: a clean shutdown that ends every connection)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)

    def create_database(self, name: str) -> None:
        """``CREATE DATABASE name`` (the server must be running)."""
        import MySQLdb

        conn = MySQLdb.connect(host="127.0.0.1", port=self.port, user="root")
        try:
            conn.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        finally:
            conn.close()

    def destroy(self) -> None:
        """Kill the server if it runs, and remove its directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def migrated_on(
    server: PrivatePostgres | PrivateMariaDB, name: str
) -> Iterator[PrivatePostgres | PrivateMariaDB]:
    """Django's default connection (and the processes a test starts with its settings) on
    database ``name`` of ``server``, started and migrated; put back and the server destroyed
    on exit. For tests whose database must go down (``transactional_db``)."""
    from django.core.management import call_command
    from django.db import connection

    saved = dict(connection.settings_dict)
    try:
        server.start()
        server.create_database(name)
        connection.close()
        connection.settings_dict.update(server.settings(name))
        call_command("migrate", run_syncdb=True, verbosity=0, interactive=False)
        yield server
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
        server.destroy()


class Proxy:
    """A TCP proxy on a free loopback port to a database server, whose connections a test can
    cut and keep cut for a while: an outage of that database for the processes connected
    through it, the shared server and its other clients untouched.

    :meth:`cut` closes every proxied connection and refuses new ones (accepted, then closed
    at once: the client reads "server closed the connection" or MariaDB's "Lost connection")
    until :meth:`restore`.
    """

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.down = threading.Event()
        self.cuts = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            if self.down.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, server))
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            self._close(source, target)

    def _close(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            with self._lock:
                self._open.discard(sock)

    def cut(self) -> int:
        """Close every connection and refuse new ones; return how many were open."""
        self.down.set()
        with self._lock:
            sockets = list(self._open)
        self._close(*sockets)
        self.cuts += len(sockets)
        return len(sockets)

    def restore(self) -> None:
        """Accept connections again."""
        self.down.clear()

    def close(self) -> None:
        self.listener.close()
        self.cut()
