"""``manage.py tasks_coord_partition``: give the task table the shape ``PARTITION_TASKS`` asks for.

PostgreSQL only. With ``TASKS_COORD["PARTITION_TASKS"]`` on (the default) it partitions an
unpartitioned task table by topic; with it off, it turns a partitioned table back into
one table. Online and in batches (see :func:`django_tasks_coord.partitions.convert`):
nodes keep running. It also drops the empty partitions of deleted topics.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_tasks_coord import db, partitions


class Command(BaseCommand):
    help = (
        "PostgreSQL: partition the task table by topic (or, with TASKS_COORD['PARTITION_TASKS'] "
        "off, turn it back into one table), online, copying rows in batches; then drop the "
        "empty partitions of deleted topics."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=int,
            default=10_000,
            metavar="ROWS",
            help="Rows copied per transaction (default: 10000).",
        )
        parser.add_argument(
            "--keep-old",
            action="store_true",
            help="Keep the old table as <table>_old instead of dropping it (the next run drops it).",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="Change nothing; exit with status 1 if the table needs converting.",
        )

    def handle(
        self, *args: Any, batch_size: int, keep_old: bool, check: bool, **options: Any
    ) -> None:
        connection = connections[db.alias()]
        if not partitions.supported(connection):
            raise CommandError(
                f"The task table is partitioned on PostgreSQL only; {connection.display_name} keeps "
                "one table (see docs/howto/production.md)."
            )
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        wanted = partitions.wanted(connection)
        shape = "partitioned by topic" if wanted else "one table"
        if partitions.is_partitioned(connection) == wanted:
            self.stdout.write(f"The task table is already {shape}.")
        elif check:
            self.stdout.write(f"The task table should be {shape}: run without --check.")
            raise SystemExit(1)
        else:
            partitions.convert(
                partitioned=wanted,
                batch_size=batch_size,
                keep_old=keep_old,
                progress=lambda message: self.stdout.write(message),
            )
        if not check and wanted:
            for name in partitions.drop_orphans(connection):
                self.stdout.write(f"Dropped {name}, the empty partition of a deleted topic.")
