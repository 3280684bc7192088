"""``manage.py tasks_coord <subcommand>``: day-2 operations (see :mod:`django_tasks_coord.operations`).

Parsing and printing only: every subcommand calls one function of
:mod:`~django_tasks_coord.operations`, which logs what it changed.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_tasks_coord import operations
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import TasksCoordError
from django_tasks_coord.management.commands._arguments import number
from django_tasks_coord.operations import Action, TaskFilter

_BULK_HELP = {
    Action.RETRY: "Put FAILED tasks back to PENDING, in place (queue.reset).",
    Action.RESET: "Put completed tasks back to PENDING, in place (queue.reset).",
    Action.RECREATE: "Add a new PENDING copy of each completed task (queue.recreate).",
    Action.CANCEL: "Cancel PENDING and REQUESTED tasks; ask ACTIVE ones to stop (queue.cancel).",
}
_PAST = {
    Action.RETRY: "Retried",
    Action.RESET: "Reset",
    Action.RECREATE: "Recreated",
    Action.CANCEL: "Canceled",
}


def _age(value: str) -> timedelta:
    try:
        return operations.parse_age(value)
    except TasksCoordError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _state(value: str) -> TaskState:
    try:
        return operations.parse_state(value)
    except TasksCoordError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_count = number(int, 1, "a whole number", maximum=operations.MAX_LIST)
_sequence = number(int, 1, "a task sequence (a number)")


def actor() -> str:
    """Who runs the command, for the logs and a run's requester: ``cli:user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container)
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"[:255]


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = [[c.upper() for c in columns], *cells]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _selection_arguments() -> CommandParser:
    """The options that select tasks (a :class:`TaskFilter`), shared by several subcommands."""
    selection = CommandParser(add_help=False)
    selection.add_argument("--topic", help="Tasks of this topic.")
    selection.add_argument(
        "--state",
        type=_state,
        action="append",
        dest="states",
        metavar="STATE",
        help="Tasks in this state (repeatable): pending, requested, active, succeeded, "
        "suspended, filtered, failed, canceled, redundant.",
    )
    selection.add_argument("--identifier", help="Tasks of this identifier.")
    selection.add_argument(
        "--older-than",
        type=_age,
        metavar="AGE",
        help="Tasks created at least AGE ago (300, 90s, 15m, 1h30m, 2d, 1w).",
    )
    selection.add_argument(
        "--newer-than", type=_age, metavar="AGE", help="Tasks created at most AGE ago."
    )
    return selection


def _add_task_commands(commands: Any, selection: CommandParser, output: CommandParser) -> None:
    """``list``, ``show`` and one subcommand per bulk :class:`Action`."""
    listing = commands.add_parser(
        "list", parents=[selection, output], help="List tasks, newest first."
    )
    listing.add_argument("--limit", type=_count, default=50, help="At most this many (default 50).")
    listing.add_argument(
        "--before",
        type=_sequence,
        metavar="SEQUENCE",
        help="Tasks below this sequence (the next page: the last sequence listed).",
    )

    show = commands.add_parser(
        "show", parents=[output], help="One task: payload, attempts, errors."
    )
    show.add_argument("sequence", type=_sequence)

    for action in Action:
        bulk = commands.add_parser(
            action.value, parents=[selection, output], help=_BULK_HELP[action]
        )
        bulk.add_argument(
            "--all",
            action="store_true",
            help="Required when no filter is given: every eligible task of every topic.",
        )
        bulk.add_argument(
            "--dry-run",
            action="store_true",
            help="Report what would change; change nothing.",
        )
        bulk.add_argument(
            "--batch-size",
            type=_count,
            default=operations.BATCH_SIZE,
            help=f"Tasks per transaction (default {operations.BATCH_SIZE}).",
        )
        bulk.add_argument("--limit", type=_count, help="Stop after this many tasks.")
        if action is Action.CANCEL:
            bulk.add_argument("--message", help="Stored on each canceled task.")


def _add_topic_and_job_commands(commands: Any, output: CommandParser) -> None:
    """``topics``, ``pause-topic``, ``resume-topic``, ``jobs``, ``pause-job``, ``resume-job``, ``run-job``."""
    commands.add_parser("topics", parents=[output], help="List topics.")
    for verb in ("pause", "resume"):
        topic = commands.add_parser(
            f"{verb}-topic", parents=[output], help=f"{verb.capitalize()} topics."
        )
        topic.add_argument("topics", nargs="+", metavar="TOPIC")

    commands.add_parser("jobs", parents=[output], help="List scheduled jobs.")
    for verb in ("pause", "resume"):
        job = commands.add_parser(
            f"{verb}-job", parents=[output], help=f"{verb.capitalize()} scheduled jobs."
        )
        job.add_argument("jobs", nargs="*", metavar="JOB_ID")
        job.add_argument(
            "--all",
            action="store_true",
            help=f"{verb.capitalize()} every job at once (scheduling.{verb}_all).",
        )
    run = commands.add_parser("run-job", parents=[output], help="Run a job now.")
    run.add_argument("job", metavar="JOB_ID")


class Command(BaseCommand):
    help = (
        "Day-2 operations: list and show tasks, retry/reset/recreate/cancel them in bulk "
        "(in batches, with --dry-run), pause and resume topics and jobs, run a job now, "
        "list nodes and leaders. --json writes JSON for scripts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        output = CommandParser(add_help=False)
        output.add_argument("--json", action="store_true", help="Write JSON (stable keys).")
        selection = _selection_arguments()
        commands = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        _add_task_commands(commands, selection, output)
        _add_topic_and_job_commands(commands, output)
        commands.add_parser("nodes", parents=[output], help="List nodes, alive or dead.")
        commands.add_parser("leaders", parents=[output], help="List groups and their leaders.")

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand: str = options["subcommand"]
        handler: Callable[[dict[str, Any]], Any] = getattr(
            self, f"do_{subcommand.replace('-', '_')}"
        )
        try:
            data = handler(options)
        except TasksCoordError as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))

    def text(self, options: dict[str, Any], text: str) -> None:
        """Write ``text`` unless the output is JSON."""
        if not options["json"]:
            self.stdout.write(text)

    # --- tasks ----------------------------------------------------------------------------

    @staticmethod
    def _filter(options: dict[str, Any]) -> TaskFilter:
        return TaskFilter(
            topic=options["topic"],
            states=tuple(dict.fromkeys(options["states"] or ())),
            identifier=options["identifier"],
            older_than=options["older_than"],
            newer_than=options["newer_than"],
        )

    def do_list(self, options: dict[str, Any]) -> dict[str, Any]:
        tasks = operations.list_tasks(
            self._filter(options), limit=options["limit"], before=options["before"]
        )
        rows = [operations.task_data(t) for t in tasks]
        more = len(tasks) == options["limit"]
        next_before = tasks[-1].sequence if tasks and more else None
        columns = ("sequence", "topic", "identifier", "state", "attempts", "created_at", "label")
        self.text(options, _table(rows, columns) if rows else "No tasks match.")
        if next_before is not None:
            self.text(options, f"More: --before {next_before}")
        return {"tasks": rows, "next_before": next_before}

    def do_show(self, options: dict[str, Any]) -> dict[str, Any]:
        data = operations.task_data(operations.get_task(options["sequence"]), full=True)
        for key, value in data.items():
            if isinstance(value, (dict, list)) or (isinstance(value, str) and "\n" in value):
                shown = value if isinstance(value, str) else json.dumps(value, indent=2)
                self.text(options, f"{key}:\n  " + shown.replace("\n", "\n  "))
            else:
                self.text(options, f"{key}: {_cell(value)}")
        return data

    def _bulk(self, action: Action, options: dict[str, Any]) -> dict[str, Any]:
        selection = self._filter(options)
        if selection.is_empty and not options["all"]:
            raise CommandError(
                f"{action.value} needs a filter (--topic, --state, --identifier, --older-than, "
                f"--newer-than), or --all for every eligible task."
            )
        result = operations.bulk(
            action,
            selection,
            dry_run=options["dry_run"],
            batch_size=options["batch_size"],
            limit=options["limit"],
            actor=actor(),
            message=options.get("message"),
        )
        topics = ", ".join(f"{t}: {n}" for t, n in sorted(result.by_topic.items()))
        where = f" ({topics}; sequences {result.first_sequence} to {result.last_sequence})"
        if result.dry_run:
            self.text(
                options,
                f"Dry run: would {action.value} {result.matched} task(s) matching "
                f"{selection.describe()}{where if result.matched else ''}. Nothing changed.",
            )
        else:
            self.text(
                options,
                f"{_PAST[action]} {result.changed} of {result.matched} task(s) matching "
                f"{selection.describe()}{where if result.matched else ''}, in "
                f"{result.batches} batch(es) of up to {result.batch_size}.",
            )
            if result.skipped:
                self.text(
                    options,
                    f"Skipped {result.skipped} task(s) that changed meanwhile or were held "
                    f"by a node: run it again for them.",
                )
        return result.data()

    def do_retry(self, options: dict[str, Any]) -> dict[str, Any]:
        return self._bulk(Action.RETRY, options)

    def do_reset(self, options: dict[str, Any]) -> dict[str, Any]:
        return self._bulk(Action.RESET, options)

    def do_recreate(self, options: dict[str, Any]) -> dict[str, Any]:
        return self._bulk(Action.RECREATE, options)

    def do_cancel(self, options: dict[str, Any]) -> dict[str, Any]:
        return self._bulk(Action.CANCEL, options)

    # --- topics and jobs ------------------------------------------------------------------

    def do_topics(self, options: dict[str, Any]) -> dict[str, Any]:
        rows = operations.list_topics()
        columns = ("name", "paused", "consecutive_failures")
        self.text(options, _table(rows, columns) if rows else "No topics.")
        return {"topics": rows}

    def _topics(self, options: dict[str, Any], paused: bool) -> dict[str, Any]:
        changed = operations.set_topics_paused(options["topics"], paused, actor=actor())
        verb, state = ("Paused", "paused") if paused else ("Resumed", "running")
        for name, did in changed.items():
            self.text(options, f"{verb} topic {name}." if did else f"Topic {name} was {state}.")
        return {"paused": paused, "changed": changed}

    def do_pause_topic(self, options: dict[str, Any]) -> dict[str, Any]:
        return self._topics(options, True)

    def do_resume_topic(self, options: dict[str, Any]) -> dict[str, Any]:
        return self._topics(options, False)

    def do_jobs(self, options: dict[str, Any]) -> dict[str, Any]:
        rows = [operations.job_data(job) for job in operations.list_jobs()]
        every = operations.all_jobs_paused()
        columns = ("id", "kind", "timer", "paused", "enabled", "nextrun", "last_outcome")
        self.text(options, _table(rows, columns) if rows else "No jobs.")
        if every:
            self.text(options, "Every job is paused (pause-job --all); resume-job --all undoes it.")
        return {"jobs": rows, "all_paused": every}

    def _jobs(self, options: dict[str, Any], paused: bool) -> dict[str, Any]:
        if bool(options["jobs"]) == options["all"]:
            raise CommandError("Name one or more job ids, or pass --all (not both).")
        jobs = operations.set_jobs_paused(
            options["jobs"], paused, every=options["all"], actor=actor()
        )
        verb = "Paused" if paused else "Resumed"
        self.text(options, f"{verb} every job." if options["all"] else f"{verb} {', '.join(jobs)}.")
        return {"paused": paused, "all": options["all"], "jobs": jobs}

    def do_pause_job(self, options: dict[str, Any]) -> dict[str, Any]:
        return self._jobs(options, True)

    def do_resume_job(self, options: dict[str, Any]) -> dict[str, Any]:
        return self._jobs(options, False)

    def do_run_job(self, options: dict[str, Any]) -> dict[str, Any]:
        run = operations.run_job(options["job"], actor=actor())
        self.text(options, f"Submitted a run of {options['job']}: task {run.sequence}.")
        return {"job": options["job"], "task": operations.task_data(run)}

    # --- nodes ----------------------------------------------------------------------------

    def do_nodes(self, options: dict[str, Any]) -> dict[str, Any]:
        rows = operations.list_nodes()
        columns = ("name", "alive", "heartbeat_age_seconds", "tasks_held", "host", "pid")
        self.text(options, _table(rows, columns) if rows else "No nodes.")
        return {"nodes": rows}

    def do_leaders(self, options: dict[str, Any]) -> dict[str, Any]:
        rows = operations.list_leaders()
        columns = ("group", "leader", "term", "alive", "heartbeat_age_seconds", "acquired_at")
        self.text(options, _table(rows, columns) if rows else "No groups.")
        return {"leaders": rows}
