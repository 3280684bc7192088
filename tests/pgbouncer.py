"""A real PgBouncer in front of the test database, for the tests of pooled deployments.

:func:`start` runs Debian's ``pgbouncer`` (``/usr/sbin/pgbouncer``) in the foreground on a
free port of 127.0.0.1, forwarding every database name to the PostgreSQL server of the
test run, in the pooling mode asked for, with a small server pool so that many client
connections really share a few server connections. Its admin console (database
``pgbouncer``) answers ``SHOW POOLS`` / ``SHOW CLIENTS`` (:meth:`PgBouncer.show`).

Without the binary the tests that need it are skipped, except under ``CI=true``, where
``.ci/run`` installs it and a missing binary fails them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

BINARY = Path("/usr/sbin/pgbouncer")
#: pgbouncer refuses to run as root; when the tests are root it drops to this user.
RUN_AS = "postgres"


def require() -> None:
    """Skip the calling test without PgBouncer (fail it under ``CI=true``)."""
    if BINARY.exists():
        return
    message = f"PgBouncer is not installed ({BINARY}; Debian package pgbouncer)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}: .ci/run installs it.")
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    """A running PgBouncer: its port, and its admin console."""

    def __init__(self, port: int, server: dict[str, Any], proc: subprocess.Popen[str]) -> None:
        self.port = port
        self.server = server
        self.proc = proc

    def database(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Django ``DATABASES`` settings reaching ``settings``' database through this PgBouncer.

        Server-side cursors are off, as Django requires with transaction pooling.
        """
        return {
            **settings,
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "DISABLE_SERVER_SIDE_CURSORS": True,
        }

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW what`` on the admin console, rows as dicts (``POOLS``, ``CLIENTS``...)."""
        import psycopg  # the postgres extra: only the PostgreSQL tests get here

        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            dbname="pgbouncer",
            user=self.server["USER"],
            autocommit=True,
            prepare_threshold=None,
        ) as conn:
            cursor = conn.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@contextmanager
def start(
    server: dict[str, Any], *, pool_mode: str = "transaction", pool_size: int = 3
) -> Iterator[PgBouncer]:
    """Run PgBouncer in front of the PostgreSQL server of Django settings ``server``.

    ``pool_size`` server connections per database and user serve every client; the
    ``pool_mode`` is PgBouncer's (``transaction``, ``statement``, ``session``).
    """
    require()
    user = server["USER"]
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="tasks_coord_pgbouncer_"))
    workdir.chmod(0o755)  # readable by RUN_AS
    users = workdir / "users.txt"
    users.write_text(f'"{user}" ""\n')
    ini = workdir / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = host={server['HOST'] or '127.0.0.1'} port={server['PORT'] or 5432}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {users}\n"
        f"admin_users = {user}\n"
        f"pool_mode = {pool_mode}\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 500\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    for path in (users, ini):
        path.chmod(0o644)
    command = [str(BINARY), str(ini)]
    if os.geteuid() == 0:
        command[1:1] = ["-u", RUN_AS]
    # Its log goes to a file: a pipe nobody reads would fill up and freeze it mid-query.
    log = (workdir / "pgbouncer.log").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=workdir)
    try:
        deadline = time.monotonic() + 30
        while True:  # until it accepts connections
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    text = (workdir / "pgbouncer.log").read_text()
                    raise RuntimeError(f"PgBouncer did not start: {text}") from None
                time.sleep(0.05)  # polling a condition with a deadline
        yield PgBouncer(port, server, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
