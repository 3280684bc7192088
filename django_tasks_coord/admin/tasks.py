"""Tasks: a changelist that stays fast on millions of rows, the full detail, revive and cancel."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from django_tasks_coord import db, queue
from django_tasks_coord.admin.base import (
    EstimatedCountPaginator,
    InputFilter,
    ServiceActionsAdmin,
    run_service,
    when,
)
from django_tasks_coord.admin.definitions import DefinitionFilter
from django_tasks_coord.models import Checkpoint, Task


class IdentifierFilter(InputFilter):
    """Tasks of one identifier, in any topic (served by ``tasks_coord_admin_identifier``)."""

    title = _("identifier")
    parameter_name = "identifier"
    field = "identifier"


class RecreatedFilter(admin.SimpleListFilter):
    """Recreated tasks (copies made by ``recreate``) or originals.

    Filters on ``original``, whose foreign-key index serves it: only a recreated task
    has an original (a check constraint and :func:`queue.recreate` guarantee it).
    """

    title = _("recreated")
    parameter_name = "recreated"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("1", _("Yes")), ("0", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> QuerySet[Task]:
        if self.value() == "1":
            return queryset.filter(original__isnull=False)
        if self.value() == "0":
            return queryset.filter(original__isnull=True)
        return queryset


def _pretty_json(value: Any) -> Any:
    if value is None:
        return "-"
    return format_html(
        '<pre class="tc-pre">{}</pre>', json.dumps(value, indent=2, sort_keys=True, default=str)
    )


#: Checkpoints shown on a task's page (a task may record thousands).
CHECKPOINTS_SHOWN = 100

#: Characters of a task's message shown in the list (the whole message is in its tooltip).
MESSAGE_CHARS = 60


def _logged_time(value: object) -> str:
    """An attempt log's ISO time, shown with :func:`when`."""
    parsed = parse_datetime(value) if isinstance(value, str) else None
    return when(parsed) if parsed is not None else "-"


def _logged_error(entry: dict[str, Any]) -> str:
    """An attempt's error in one line: the exception class and message, or the message."""
    path = entry.get("exception_class_path")
    error = entry.get("error") or entry.get("message")
    if error is None and entry.get("traceback"):
        error = str(entry["traceback"]).strip().splitlines()[-1]
    if path and error:
        return f"{str(path).rpartition('.')[2]}: {error}"
    return str(error or path or "")


def _pre(value: str | None) -> Any:
    return "-" if value is None else format_html('<pre class="tc-pre">{}</pre>', value)


@admin.register(Task)
class TaskAdmin(ServiceActionsAdmin):
    """Every task of every topic; reset, recreate and cancel go through the queue's API."""

    # Narrow enough for 1280 px with Django's navigation and the filters, without scrolling
    # sideways (docs/admin.md): the label, attempts, node, creation time and recreated flag
    # are on the detail page and in the filters.
    list_display = (
        "sequence",
        "topic_name",
        "identifier",
        "state",
        "message_short",
        "finished_at",
    )
    list_display_links = ("sequence", "identifier")
    list_select_related = ("owner",)
    list_filter = (
        "topic",
        "state",
        IdentifierFilter,
        "owner",
        DefinitionFilter,
        RecreatedFilter,
        ("created_at", admin.DateFieldListFilter),
        ("finished_at", admin.DateFieldListFilter),
    )
    # Exact matches only (see get_search_results): an index serves each of them.
    search_fields = ("identifier", "label")
    search_help_text = _("An identifier, a label or a sequence number (exact).")
    ordering = ("-sequence",)
    sortable_by = ("sequence", "created_at", "finished_at")
    list_per_page = 50
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ("reset", "recreate", "cancel")
    object_actions = ("reset", "recreate", "cancel")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("sequence", "topic", "identifier"),
                    ("state", "outcome_reason"),
                    ("label", "requester"),
                    ("handler", "priority", "concurrency_key"),
                    ("owner", "exec_id", "attempts"),
                    ("progress_json", "cancel_requested_at"),
                )
            },
        ),
        (
            _("Payload and result"),
            {
                "fields": (
                    "payload_json",
                    "message",
                    "result_json",
                    "error_traceback",
                    "error_detail_json",
                    "attempt_log_json",
                    "checkpoints_table",
                )
            },
        ),
        (
            _("Lifecycle"),
            {
                "fields": (
                    ("created_at", "execute_at"),
                    ("started_at", "finished_at"),
                    ("deadline", "slot", "term"),
                )
            },
        ),
        (_("Revival"), {"fields": ("recreated", "original_link", "recreations_links")}),
    )
    readonly_fields = (
        "sequence",
        "topic",
        "identifier",
        "state",
        "outcome_reason",
        "label",
        "requester",
        "handler",
        "priority",
        "concurrency_key",
        "owner",
        "exec_id",
        "attempts",
        "progress_json",
        "cancel_requested_at",
        "payload_json",
        "message",
        "result_json",
        "error_traceback",
        "error_detail_json",
        "attempt_log_json",
        "checkpoints_table",
        "created_at",
        "execute_at",
        "started_at",
        "finished_at",
        "deadline",
        "slot",
        "term",
        "recreated",
        "original_link",
        "recreations_links",
    )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Task], search_term: str
    ) -> tuple[QuerySet[Task], bool]:
        """Exact identifier or label, or a sequence number: never a ``LIKE`` scan of the table."""
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(identifier=term) | Q(label=term)
        if term.isdigit():
            match |= Q(sequence=int(term))
        return queryset.filter(match), False

    @admin.display(description=_("topic"), ordering="topic_id")
    def topic_name(self, obj: Task) -> str:
        return obj.topic_id

    @admin.display(description=_("payload"))
    def payload_json(self, obj: Task) -> Any:
        return _pretty_json(obj.payload)

    @admin.display(description=_("progress"))
    def progress_json(self, obj: Task) -> Any:
        """What its handler last reported (``running.report_progress``, an executor's notify)."""
        return _pretty_json(obj.progress)

    @admin.display(description=_("result"))
    def result_json(self, obj: Task) -> Any:
        return _pretty_json(obj.result)

    @admin.display(description=_("error (traceback)"))
    def error_traceback(self, obj: Task) -> Any:
        return _pre(obj.error)

    @admin.display(description=_("error detail"))
    def error_detail_json(self, obj: Task) -> Any:
        return _pretty_json(obj.error_detail)

    @admin.display(description=_("message"))
    def message_short(self, obj: Task) -> Any:
        """The message, cut to :data:`MESSAGE_CHARS` (the whole of it in the tooltip)."""
        if not obj.message:
            return ""
        return format_html(
            '<span title="{}">{}</span>', obj.message, Truncator(obj.message).chars(MESSAGE_CHARS)
        )

    @admin.display(description=_("attempt log"))
    def attempt_log_json(self, obj: Task) -> Any:
        """Each attempt: its node, start and end, outcome and error (consumers and ``@task``)."""
        entries = [entry for entry in obj.attempt_log or [] if isinstance(entry, dict)]
        if not entries:
            return "-"
        rows = (
            (
                entry.get("attempt", "?"),
                entry.get("worker_id") or "-",
                _logged_time(entry.get("started_at")),
                _logged_time(entry.get("finished_at")),
                entry.get("outcome", "-"),
                _logged_error(entry),
            )
            for entry in entries
        )
        return format_html(
            '<table class="tc-attempts"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th>'
            "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
            _("attempt"),
            _("node"),
            _("started"),
            _("finished"),
            _("outcome"),
            _("error"),
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                rows,
            ),
        )

    @admin.display(description=_("checkpoints"))
    def checkpoints_table(self, obj: Task) -> Any:
        """What its handler recorded as done (``running.checkpoint``, ``running.step``,
        composite steps): name, the attempt that wrote it, when, and the value. The first
        :data:`CHECKPOINTS_SHOWN`, in the order they were written."""
        rows = list(
            Checkpoint.objects.using(db.alias())
            .filter(task_id=obj.pk)
            .order_by("id")
            .values_list("name", "attempt", "written_at", "value")[: CHECKPOINTS_SHOWN + 1]
        )
        if not rows:
            return "-"
        more = ""
        if len(rows) > CHECKPOINTS_SHOWN:
            rows = rows[:CHECKPOINTS_SHOWN]
            total = Checkpoint.objects.using(db.alias()).filter(task_id=obj.pk).count()
            more = format_html("<p>{}</p>", _("and %(n)s more") % {"n": total - len(rows)})
        return format_html(
            '<table class="tc-attempts"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
            "<th>{}</th></tr></thead><tbody>{}</tbody></table>{}",
            _("name"),
            _("attempt"),
            _("written at"),
            _("value"),
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                (
                    (name, attempt, when(at), _pretty_json(value))
                    for name, attempt, at, value in rows
                ),
            ),
            more,
        )

    @admin.display(description=_("original"))
    def original_link(self, obj: Task) -> Any:
        if obj.original_id is None:
            return "-"
        original = Task.objects.filter(pk=obj.original_id).first()
        if original is None:
            return format_html("#{} ({})", obj.original_id, _("purged"))
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:django_tasks_coord_task_change", args=[original.pk]),
            original,
        )

    @admin.display(description=_("recreated as"))
    def recreations_links(self, obj: Task) -> Any:
        copies = list(Task.objects.filter(original_id=obj.pk).order_by("sequence")[:20])
        if not copies:
            return "-"
        return format_html_join(
            ", ",
            '<a href="{}">#{}</a>',
            ((reverse("admin:django_tasks_coord_task_change", args=[t.pk]), t.pk) for t in copies),
        )

    def has_revive_permission(self, request: HttpRequest) -> bool:
        """``django_tasks_coord.revive_task``: reset and recreate."""
        return request.user.has_perm("django_tasks_coord.revive_task")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """``django_tasks_coord.cancel_task``."""
        return request.user.has_perm("django_tasks_coord.cancel_task")

    def object_action_fits(self, obj: Task, name: str) -> bool:
        return obj.is_completed != (name == "cancel")

    @admin.action(description=_("Reset (revive in place)"), permissions=["revive"])
    def reset(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        """Revive completed tasks in place (``queue.reset``)."""
        run_service(self, request, queryset.iterator(), queue.reset, "Reset")

    @admin.action(description=_("Recreate (revive as a new task)"), permissions=["revive"])
    def recreate(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        """Revive completed tasks as new tasks (``queue.recreate``); the originals stay."""
        run_service(self, request, queryset.iterator(), queue.recreate, "Recreated")

    @admin.action(description=_("Cancel"), permissions=["cancel"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        """Cancel tasks that are not completed yet (``queue.cancel``): running ones are
        asked to stop, and end CANCELED once their handlers return."""
        run_service(self, request, queryset.iterator(), queue.cancel, "Canceled")
