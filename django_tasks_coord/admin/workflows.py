"""Workflows: a list with their states and step counts, a page with the graph as a picture,
and cancel (``workflows.cancel``). Read-only otherwise: a workflow changes only as its
steps' tasks end (the nodes advance it).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_tasks_coord import workflows
from django_tasks_coord.admin.base import (
    EstimatedCountPaginator,
    ServiceActionsAdmin,
    run_service,
    when,
)
from django_tasks_coord.admin.graph import MAX_DRAWN, Node, layout
from django_tasks_coord.models import StepState, Task, Workflow, WorkflowState, WorkflowStep

#: Step states that are final (counted as done in the list).
FINAL_STEP_STATES = [state.value for state in StepState if state.is_final]


def _step_count(**filters: Any) -> Coalesce:
    """A per-row subquery: the workflow's steps (matching ``filters``); evaluated only for
    the rows of the page, not grouped over the whole table."""
    steps = (
        WorkflowStep.objects.filter(workflow=OuterRef("pk"), **filters)
        .order_by()
        .values("workflow")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(steps, output_field=IntegerField()), 0)


def _task_url(sequence: int) -> str:
    return reverse("admin:django_tasks_coord_task_change", args=[sequence])


def _tooltip(step: WorkflowStep) -> str:
    lines = [f"{step.name}: {StepState(step.state).label}", f"{step.kind} {step.target}"]
    if step.task_sequence is not None:
        lines.append(f"task {step.task_topic}#{step.task_sequence}")
    if step.message:
        lines.append(step.message[:300])
    return "\n".join(lines)


@admin.register(Workflow)
class WorkflowAdmin(ServiceActionsAdmin):
    """Every workflow; its page draws its graph. Cancel goes through ``workflows.cancel``."""

    list_display = ("id", "name", "state", "steps_done", "created_at", "finished_at")
    list_display_links = ("id", "name")
    list_filter = ("state",)
    search_fields = ("name",)
    search_help_text = _("A workflow's id (exact) or part of its name.")
    ordering = ("-id",)
    sortable_by = ("id", "created_at", "finished_at")
    list_per_page = 50
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ("cancel",)
    object_actions = ("cancel",)
    fieldsets = (
        (None, {"fields": (("id", "name", "state"), ("created_at", "finished_at"), "steps_done")}),
        (_("Graph"), {"fields": ("graph",)}),
        (_("Steps"), {"fields": ("steps_table",)}),
        (_("Options"), {"fields": ("options_json",)}),
    )
    readonly_fields = (
        "id",
        "name",
        "state",
        "created_at",
        "finished_at",
        "steps_done",
        "graph",
        "steps_table",
        "options_json",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workflow]:
        rows: QuerySet[Workflow] = super().get_queryset(request)
        return rows.annotate(
            steps_total=_step_count(), steps_final=_step_count(state__in=FINAL_STEP_STATES)
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Workflow], search_term: str
    ) -> tuple[QuerySet[Workflow], bool]:
        """An id (exact) or part of a name."""
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(name__icontains=term)
        if term.isdigit() and len(term) < 19:  # a bigint: larger numbers match no id
            match |= Q(pk=int(term))
        return queryset.filter(match), False

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """404 for an id that is no workflow (a bad or stale link), not a redirect."""
        if self.get_object(request, unquote(object_id)) is None:
            raise Http404(f"No workflow with the id {object_id!r}.")
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description=_("steps done"))
    def steps_done(self, obj: Workflow) -> str:
        """Final steps of all steps: ``7 / 10``."""
        total = getattr(obj, "steps_total", None)
        if total is None:
            total = obj.steps.count()
            final = obj.steps.filter(state__in=FINAL_STEP_STATES).count()
        else:
            final = obj.steps_final  # type: ignore[attr-defined]
        return f"{final} / {total}"

    def _steps(self, obj: Workflow) -> list[WorkflowStep]:
        cache = getattr(obj, "_admin_steps", None)
        if cache is None:
            cache = list(WorkflowStep.objects.filter(workflow=obj).order_by("id"))
            sequences = [s.task_sequence for s in cache if s.task_sequence is not None]
            kept = set(
                Task.objects.filter(sequence__in=sequences).values_list("sequence", flat=True)
            )
            for step in cache:
                step.task_url = _task_url(step.task_sequence) if step.task_sequence in kept else ""
            obj._admin_steps = cache  # type: ignore[attr-defined]
        return cache

    @admin.display(description=_("graph"))
    def graph(self, obj: Workflow) -> Any:
        """The steps colored by state, the ``after`` edges; each step links to its task."""
        steps = self._steps(obj)
        if len(steps) > MAX_DRAWN:
            return _("%(n)d steps: too many to draw (at most %(max)d); see the list below.") % {
                "n": len(steps),
                "max": MAX_DRAWN,
            }
        nodes = [
            Node(
                name=step.name,
                after=list(step.after or []),
                state=str(step.state),
                tooltip=_tooltip(step),
                url=getattr(step, "task_url", ""),
            )
            for step in steps
        ]
        return SafeString(
            render_to_string(
                "admin/django_tasks_coord/workflow_graph.html",
                {"picture": layout(nodes), "states": StepState.choices},
            )
        )

    @admin.display(description=_("steps"))
    def steps_table(self, obj: Workflow) -> Any:
        """Each step: kind and target, state, parents, its task (linked), times, message."""
        rows = []
        for step in self._steps(obj):
            if step.task_sequence is None:
                task: Any = "-"
            elif getattr(step, "task_url", ""):
                task = format_html(
                    '<a href="{}">{}#{}</a>',
                    getattr(step, "task_url", ""),
                    step.task_topic,
                    step.task_sequence,
                )
            else:
                task = format_html("{}#{} ({})", step.task_topic, step.task_sequence, _("purged"))
            rows.append(
                (
                    step.name,
                    f"{step.kind} {step.target}",
                    StepState(step.state).label,
                    ", ".join(step.after or []) or "-",
                    task,
                    when(step.enqueued_at),
                    when(step.finished_at),
                    step.message[:200],
                )
            )
        return format_html(
            '<table class="tc-attempts tc-steps"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>',
            format_html_join(
                "",
                "<th>{}</th>",
                (
                    (label,)
                    for label in (
                        _("step"),
                        _("kind and target"),
                        _("state"),
                        _("after"),
                        _("task"),
                        _("enqueued"),
                        _("finished"),
                        _("message"),
                    )
                ),
            ),
            format_html_join(
                "",
                "<tr>" + "<td>{}</td>" * 8 + "</tr>",
                rows,
            ),
        )

    @admin.display(description=_("options"))
    def options_json(self, obj: Workflow) -> Any:
        return format_html(
            '<pre class="tc-pre">{}</pre>', json.dumps(obj.options, indent=2, sort_keys=True)
        )

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """``django_tasks_coord.cancel_task``: cancelling a workflow cancels its tasks."""
        return request.user.has_perm("django_tasks_coord.cancel_task")

    def object_action_fits(self, obj: Workflow, name: str) -> bool:
        return obj.state == WorkflowState.RUNNING

    @admin.action(description=_("Cancel"), permissions=["cancel"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
        """Cancel running workflows (``workflows.cancel``): waiting steps end CANCELED,
        their tasks are canceled (running ones asked to stop)."""
        run_service(self, request, queryset.iterator(), _cancel, "Canceled")


def _cancel(workflow: Workflow) -> bool:
    """``workflows.cancel``, refusing (per workflow, in the action's message) one that ended."""
    if not workflows.cancel(workflow.pk):
        raise workflows.WorkflowError(f"It had ended already ({workflow.state}).")
    return True
