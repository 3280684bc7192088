"""Periodic jobs: timers with their next elapses, outcomes; pause, resume, run now, pause all."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from django_tasks_coord import flow, scheduling
from django_tasks_coord.admin.base import ServiceActionsAdmin, run_service, when
from django_tasks_coord.admin.topics import task_list_url
from django_tasks_coord.exceptions import TasksCoordError
from django_tasks_coord.models import JobKind, PeriodicTask, Topic
from django_tasks_coord.scheduling.names import run_topic
from django_tasks_coord.scheduling.runner import import_problem, retry_policy
from django_tasks_coord.scheduling.scheduler import jobs_paused, timing_of
from django_tasks_coord.timers import parse
from django_tasks_coord.timers.base import get_zone

#: How many upcoming elapses the detail page shows.
NEXT_ELAPSES = 5
#: Fields an operator may edit, on periodic jobs scheduled at run time (not declared in code).
EDITABLE = ("timer", "tz", "args", "kwargs", "priority")


def finished(job: PeriodicTask) -> bool:
    """Whether ``job`` will never run again: the scheduler disabled it for good (a one-time
    job that ran, ``max_count`` runs submitted, past its ``end_time``, unscheduled by its
    error policy)."""
    return not job.enabled and job.finished_at is not None


def editable(job: PeriodicTask | None) -> bool:
    """Whether the admin may edit ``job``: a periodic job scheduled at run time, not finished.

    Jobs declared in code are read-only (an edit or a delete would come back at the next
    node start); so are recurring and one-time jobs (their options are not a timer).
    """
    return (
        job is not None and job.kind == JobKind.PERIODIC and not job.declared and not finished(job)
    )


def status(job: PeriodicTask) -> str:
    """The job's state in words: Finished, Disabled, Paused (and why) or Scheduled."""
    if finished(job):
        return str(_("Finished: it will not run again"))
    if not job.enabled:
        if job.declared:
            return str(_("Disabled: no longer declared in code"))
        return str(_("Disabled"))
    if job.paused:
        if import_problem(job.task) is not None:
            return str(_("Paused: its callable does not import"))
        return str(_("Paused"))
    return str(_("Scheduled"))


def next_elapses(job: PeriodicTask, now: datetime, count: int = NEXT_ELAPSES) -> list[datetime]:
    """The next ``count`` times ``job``'s timer elapses after ``now``, within its start and end
    and its remaining runs (``max_count``); none once it is finished."""
    if finished(job):
        return []
    if job.max_count > 0:
        count = max(min(count, job.max_count - job.run_count), 0)
    timer = timing_of(job).timer
    at = now
    if job.start_time is not None and job.start_time > at:
        at = job.start_time - timedelta(microseconds=1)
    elapses: list[datetime] = []
    while len(elapses) < count:
        following = timer.next_after(at)
        if following is None or (job.end_time is not None and following > job.end_time):
            break
        elapses.append(following)
        at = following
    return elapses


def schedule_options(job: PeriodicTask) -> dict[str, Any]:
    """The ``schedule_*`` options a stored job was scheduled with (to schedule it again)."""
    return {
        "job_id": job.id,
        "args": job.args,
        "kwargs": job.kwargs,
        "priority": job.priority,
        "group": job.group,
        "leader_only": job.leader_only,
        "max_count": job.max_count,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "policy": job.error_policy,
        "waiting_policy": job.waiting_policy,
        "waiting_time": job.waiting_time,
        "retry": retry_policy(job.retry) if job.retry else None,
        "fixed_delay": job.fixed_delay,
        "allow_overlap": job.allow_overlap,
        "catch_up": job.catch_up,
        "catch_up_limit": job.catch_up_limit,
        "declared": job.declared,
    }


if TYPE_CHECKING:
    ModelForm = forms.ModelForm[PeriodicTask]
else:
    ModelForm = forms.ModelForm  # not subscriptable at run time


class PeriodicJobForm(ModelForm):
    """Edits a periodic job's timer, zone, arguments and priority; the timer must parse."""

    class Meta:
        model = PeriodicTask
        fields = EDITABLE

    def clean_args(self) -> Any:
        args = self.cleaned_data.get("args")
        if not isinstance(args, list):
            raise forms.ValidationError(_("Arguments must be a JSON list."))
        return args

    def clean_kwargs(self) -> Any:
        kwargs = self.cleaned_data.get("kwargs")
        if not isinstance(kwargs, dict):
            raise forms.ValidationError(_("Keyword arguments must be a JSON object."))
        return kwargs

    def clean(self) -> dict[str, Any]:
        """Parse the timer in its zone; the parser's message is the error shown."""
        cleaned = super().clean() or {}
        spec, tz = cleaned.get("timer"), cleaned.get("tz") or None
        if spec is None:
            return cleaned
        try:
            timer = parse(spec, tz=tz)
        except (TasksCoordError, ValueError) as exc:
            field = "tz" if tz is not None and _bad_zone(tz) else "timer"
            self.add_error(field, str(exc))
            return cleaned
        if timer.next_after(timezone.now()) is None:
            self.add_error("timer", _("%(timer)s never elapses again.") % {"timer": timer})
        return cleaned


def _bad_zone(tz: str) -> bool:
    try:
        get_zone(tz)
    except (TasksCoordError, ValueError):
        return True
    return False


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(ServiceActionsAdmin):
    """Scheduled jobs. Pause, resume and run now call :mod:`django_tasks_coord.scheduling`."""

    form = PeriodicJobForm
    change_list_template = "admin/django_tasks_coord/periodictask/change_list.html"
    list_display = (
        "id",
        "kind",
        "timer",
        "status",
        "nextrun",
        "last_slot",
        "last_outcome",
        "last_finished_at",
        "consecutive_failures",
    )
    list_filter = ("kind", "enabled", "paused", "last_outcome", "leader_only", "declared", "group")
    search_fields = ("id", "task")
    actions = ("pause", "resume", "run_now")
    object_actions = ("pause", "resume", "run_now")
    fieldsets = (
        (None, {"fields": ("id", "kind", "task", ("group", "leader_only"), "declared")}),
        (
            _("When"),
            {
                "fields": (
                    ("timer", "tz"),
                    "status",  # enabled and paused, in words
                    "upcoming",
                    ("nextrun", "start_time", "end_time"),
                    ("max_count", "run_count"),
                )
            },
        ),
        (
            _("Last runs"),
            {
                "fields": (
                    ("last_slot", "last_outcome", "last_finished_at"),
                    "consecutive_failures",
                    ("worker", "marked"),
                    "runs",
                )
            },
        ),
        (
            _("Options"),
            {
                "fields": (
                    ("args", "kwargs", "priority"),
                    ("error_policy", "retry"),
                    ("waiting_policy", "waiting_time"),
                    ("allow_overlap", "fixed_delay"),
                    ("catch_up", "catch_up_limit"),
                    "run_limits",
                    ("created_at", "updated_at", "finished_at"),
                )
            },
        ),
    )

    def has_change_permission(self, request: HttpRequest, obj: PeriodicTask | None = None) -> bool:
        """``change_periodictask``, and only for a job that can be edited (:func:`editable`):
        a declared or finished job has no Save button."""
        if obj is not None and not editable(obj):
            return False
        return admin.ModelAdmin.has_change_permission(self, request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: PeriodicTask | None = None) -> bool:
        """``delete_periodictask``, never for a job declared in code: the next node start
        would declare it again (remove it from the code instead)."""
        if obj is not None and obj.declared:
            return False
        return admin.ModelAdmin.has_delete_permission(self, request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: PeriodicTask | None = None) -> Any:
        every = [f.name for f in PeriodicTask._meta.concrete_fields] + [
            "status",
            "upcoming",
            "runs",
            "run_limits",
        ]
        if editable(obj):
            every = [name for name in every if name not in EDITABLE]
        return self._zoned(every)

    def save_model(self, request: HttpRequest, obj: PeriodicTask, form: Any, change: bool) -> None:
        """Schedule the job again with its new timer (``nextrun`` recomputed, nodes told)."""
        scheduling.save_job(
            obj.task, JobKind.PERIODIC, parse(obj.timer, tz=obj.tz or None), **schedule_options(obj)
        )

    def delete_model(self, request: HttpRequest, obj: PeriodicTask) -> None:
        scheduling.unschedule(obj.id)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        for job_id in queryset.values_list("id", flat=True):
            scheduling.unschedule(job_id)

    @admin.display(description=_("status"))
    def status(self, obj: PeriodicTask) -> str:
        return status(obj)

    @admin.display(description=_("next elapses"))
    def upcoming(self, obj: PeriodicTask) -> Any:
        try:
            elapses = next_elapses(obj, timezone.now())
        except (TasksCoordError, ValueError) as exc:
            return format_html('<span class="tc-bad">{}</span>', exc)
        if finished(obj):
            return format_html(
                '<span class="tc-finished">{}</span>',
                _("This job has finished (%(when)s): it will not run again.")
                % {"when": when(obj.finished_at)},
            )
        if not elapses:
            return _("none")
        zone = get_zone(obj.tz or None)
        return format_html(
            '<ol class="tc-elapses">{}</ol>',
            format_html_join(
                "",
                "<li>{} {}</li>",
                (
                    (at.astimezone(zone).isoformat(" "), at.astimezone(zone).tzname())
                    for at in elapses
                ),
            ),
        )

    @admin.display(description=_("limits of its runs"))
    def run_limits(self, obj: PeriodicTask) -> Any:
        """The job's flow limits (``scheduling.set_limits``): its entry of the run topic's
        limits of key values, linked to that topic's page, where they are edited."""
        topic = run_topic(obj)
        row = Topic.objects.filter(name=topic).values_list(*flow.FIELDS).first()
        limits = flow.Limits() if row is None else flow.Limits.of(*row)
        own = limits.key_limits.get(obj.id) if limits.key == "identifier" else None
        words = str(flow.Limits(own.rate, own.concurrency)) if own else _("none")
        url = reverse("admin:django_tasks_coord_topic_change", args=[topic])
        return format_html('{} (<a href="{}">{}</a>)', words, url, topic)

    @admin.display(description=_("runs"))
    def runs(self, obj: PeriodicTask) -> Any:
        return format_html(
            '<a href="{}">{}</a>', task_list_url(identifier=obj.id), _("Runs of this job")
        )

    # --- actions -----------------------------------------------------------------------

    def has_pause_permission(self, request: HttpRequest) -> bool:
        """``django_tasks_coord.pause_periodictask``: pause, resume, pause all, resume all."""
        return request.user.has_perm("django_tasks_coord.pause_periodictask")

    def has_run_permission(self, request: HttpRequest) -> bool:
        """``django_tasks_coord.run_periodictask``: run now."""
        return request.user.has_perm("django_tasks_coord.run_periodictask")

    def object_action_fits(self, obj: PeriodicTask, name: str) -> bool:
        if name == "run_now":
            return True
        if finished(obj):
            return False  # nothing left to pause or resume
        return obj.paused == (name == "resume")

    @admin.action(description=_("Pause"), permissions=["pause"])
    def pause(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        """Stop firing the selected jobs (``scheduling.pause``)."""
        run_service(self, request, queryset, lambda job: scheduling.pause(job.id), "Paused")

    @admin.action(description=_("Resume"), permissions=["pause"])
    def resume(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        """Fire the selected jobs again (``scheduling.resume``)."""
        run_service(self, request, queryset, lambda job: scheduling.resume(job.id), "Resumed")

    @admin.action(description=_("Run now"), permissions=["run"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        """Submit one run of each selected job at once (``scheduling.run_now``)."""
        user = request.user.get_username()
        run_service(
            self,
            request,
            queryset,
            lambda job: scheduling.run_now(job.id, requester=f"admin:{user}"),
            "Run now",
        )

    # --- pause all / resume all ----------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "pause-all/",
                self.admin_site.admin_view(require_POST(self.pause_all_view)),
                name="django_tasks_coord_periodictask_pause_all",
            ),
            path(
                "resume-all/",
                self.admin_site.admin_view(require_POST(self.resume_all_view)),
                name="django_tasks_coord_periodictask_resume_all",
            ),
            *super().get_urls(),
        ]

    def _all(self, request: HttpRequest, pause: bool) -> HttpResponse:
        if not self.has_view_permission(request) or not self.has_pause_permission(request):
            raise PermissionDenied
        (scheduling.pause_all if pause else scheduling.resume_all)()
        done = "Paused all jobs" if pause else "Resumed all jobs"
        jobs_topic = Topic.objects.get(name=scheduling.JOBS_TOPIC)
        self.log_change(request, jobs_topic, f"{done} in the admin.")
        self.message_user(request, f"{done}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:django_tasks_coord_periodictask_changelist"))

    def pause_all_view(self, request: HttpRequest) -> HttpResponse:
        """Stop firing every job (``scheduling.pause_all``). POST only."""
        return self._all(request, pause=True)

    def resume_all_view(self, request: HttpRequest) -> HttpResponse:
        """Undo pause all (``scheduling.resume_all``). POST only."""
        return self._all(request, pause=False)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {
            "jobs_paused": jobs_paused(),
            "can_pause_all": self.has_pause_permission(request),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)


__all__ = [
    "PeriodicJobForm",
    "PeriodicTaskAdmin",
    "editable",
    "finished",
    "next_elapses",
    "schedule_options",
    "status",
]
