"""``manage.py tasks_coord_prune``: delete old finished results of ``DatabaseBackend`` task backends."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_tasks_coord.management.commands._arguments import number

try:  # the backend needs Django's task framework; without it the command says what to install
    from django_tasks_coord.backends import DatabaseBackend, coord_backends
    from django_tasks_coord.backends.compat import task_backends
    from django_tasks_coord.backends.housekeeping import prune_results
except ImportError as exc:
    _MISSING: str | None = str(exc)
else:
    _MISSING = None

_seconds = number(float, 0, "a number of seconds")


class Command(BaseCommand):
    help = (
        "Delete finished django.tasks results (succeeded, failed, cancelled...) older than "
        "--older-than seconds, or each backend's OPTIONS['RESULT_RETENTION']. Waiting and "
        "running tasks are never deleted."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            action="append",
            dest="backends",
            metavar="ALIAS",
            help="Prune this TASKS alias only (repeatable; default: every DatabaseBackend).",
        )
        parser.add_argument(
            "--older-than",
            type=_seconds,
            metavar="SECONDS",
            help="Age of the results to delete (default: each backend's RESULT_RETENTION).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if _MISSING is not None:
            raise CommandError(_MISSING)
        backends = coord_backends()
        if options["backends"]:
            backends = []
            for alias in options["backends"]:
                try:
                    backend = task_backends[alias]
                except Exception as exc:  # Django raises InvalidTaskBackend (ImproperlyConfigured)
                    raise CommandError(f"No task backend {alias!r}: {exc}") from exc
                if not isinstance(backend, DatabaseBackend):
                    raise CommandError(f"Task backend {alias!r} is not a DatabaseBackend.")
                backends.append(backend)
        if not backends:
            raise CommandError("No TASKS backend is a django_tasks_coord DatabaseBackend.")
        older_than = options["older_than"]
        if older_than is None and all(b.result_retention is None for b in backends):
            raise CommandError(
                "Nothing to prune by: pass --older-than SECONDS or set "
                "OPTIONS['RESULT_RETENTION'] on the backend."
            )
        counts = prune_results(
            backends,
            older_than=None if older_than is None else timedelta(seconds=older_than),
            dry_run=options["dry_run"],
        )
        verb = "Would delete" if options["dry_run"] else "Deleted"
        for alias, count in sorted(counts.items()):
            self.stdout.write(f"{verb} {count} result(s) of task backend {alias!r}.")
