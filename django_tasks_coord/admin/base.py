"""What the app's admin classes share: service actions, estimated counts, small filters."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections, models
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from django_tasks_coord import db
from django_tasks_coord.exceptions import TasksCoordError

logger = logging.getLogger(__name__)

#: An admin action runs its service on at most this many objects per request.
MAX_ACTION_OBJECTS = 1000


def run_service[M: models.Model](
    modeladmin: admin.ModelAdmin[Any],
    request: HttpRequest,
    objects: Iterable[M],
    service: Callable[[M], object],
    done: str,
) -> int:
    """Call ``service`` on each object, log each success in the admin log, report the outcome.

    ``done`` is the past tense shown to the user and stored in the admin log
    ("Paused"). A :class:`TasksCoordError` (the task was not in a state that allows
    it...) is reported per object and does not stop the others. Returns the number
    of objects the service succeeded on.
    """
    succeeded, failures, seen = 0, [], 0
    created: list[models.Model] = []
    for obj in objects:
        seen += 1
        if seen > MAX_ACTION_OBJECTS:
            modeladmin.message_user(
                request,
                _("Stopped after %(n)d objects; select fewer or repeat the action.")
                % {"n": MAX_ACTION_OBJECTS},
                messages.WARNING,
            )
            break
        try:
            outcome = service(obj)
        except TasksCoordError as exc:
            failures.append(f"{obj}: {exc}")
            continue
        succeeded += 1
        made = ""
        if isinstance(outcome, models.Model) and outcome.pk != obj.pk:
            made = f" as #{outcome.pk}"  # recreate, run now: the new task's number
            created.append(outcome)
        modeladmin.log_change(request, obj, f"{done} in the admin{made}.")
        logger.info("%s %s (admin user %s).", done, obj, request.user)
    if succeeded:
        text = _("%(done)s: %(n)d %(name)s.") % {
            "done": done,
            "n": succeeded,
            "name": modeladmin.opts.verbose_name
            if succeeded == 1
            else modeladmin.opts.verbose_name_plural,
        }
        modeladmin.message_user(request, _with_links(text, created), messages.SUCCESS)
    for failure in failures:
        modeladmin.message_user(request, failure, messages.ERROR)
    return succeeded


#: New objects linked in an action's message at most (the admin log keeps every number).
LINKED_OBJECTS = 20


def _with_links(text: str, created: list[models.Model]) -> str:
    """``text`` followed by links to the objects an action made (the new tasks of recreate,
    run now), each to its admin page."""
    if not created:
        return text
    links = format_html_join(
        ", ",
        '<a href="{}">#{}</a>',
        (
            (reverse(f"admin:{o._meta.app_label}_{o._meta.model_name}_change", args=[o.pk]), o.pk)
            for o in created[:LINKED_OBJECTS]
        ),
    )
    more = "" if len(created) <= LINKED_OBJECTS else " ..."
    return format_html("{} {} {}{}", text, _("New:"), links, more)


def when(value: datetime | None) -> str:
    """A time for people, in the current time zone and naming it: ``2026-05-01 14:30:20 CEST``."""
    if value is None:
        return "-"
    local = timezone.localtime(value)
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"


_ZONED: dict[tuple[type[models.Model], str], Callable[[Any], str]] = {}


def zoned(model: type[models.Model], name: str) -> Callable[[Any], str]:
    """An admin column (or read-only field) showing ``model``'s datetime field ``name``
    with :func:`when`; named after the field so its CSS class stays ``field-NAME``."""
    key = (model, name)
    if key not in _ZONED:
        field = model._meta.get_field(name)

        def show(obj: Any) -> str:
            return when(getattr(obj, name))

        show.__name__ = name
        label = getattr(field, "verbose_name", name)
        _ZONED[key] = admin.display(description=label, ordering=name)(show)
    return _ZONED[key]


def _datetime_fields(model: type[models.Model]) -> set[str]:
    return {
        field.name
        for field in model._meta.concrete_fields
        if isinstance(field, models.DateTimeField)
    }


if TYPE_CHECKING:
    ModelAdmin = admin.ModelAdmin[Any]
    AnyPaginator = Paginator[Any]
else:  # not subscriptable at run time
    ModelAdmin = admin.ModelAdmin
    AnyPaginator = Paginator


class ServiceActionsAdmin(ModelAdmin):
    """A read-only ``ModelAdmin`` whose changes go through service actions.

    ``object_actions`` names admin actions (methods decorated with
    ``@admin.action(permissions=[...])``) that are also offered as buttons on the
    detail page; the buttons post to ``<pk>/action/<name>/``, which requires POST, a
    CSRF token and the action's permissions, like the changelist's actions.
    """

    object_actions: tuple[str, ...] = ()
    change_form_template = "admin/django_tasks_coord/change_form.html"

    # --- times with their zone: datetime fields shown through zoned() -------------------

    def _zoned(self, names: Any) -> Any:
        """``names`` (a list or fieldset fields, nested) with each read-only datetime field
        replaced by its :func:`zoned` column."""
        datetimes = _datetime_fields(self.model)
        editable = set(getattr(self, "zoned_editable", ()))

        def swap(name: Any) -> Any:
            if isinstance(name, list | tuple):
                return type(name)(swap(item) for item in name)
            if isinstance(name, str) and name in datetimes and name not in editable:
                return zoned(self.model, name)
            return name

        return swap(names)

    def get_list_display(self, request: HttpRequest) -> Any:
        return self._zoned(super().get_list_display(request))

    def get_sortable_by(self, request: HttpRequest) -> Any:
        return self._zoned(super().get_sortable_by(request))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._zoned(super().get_readonly_fields(request, obj))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return [
            (title, {**options, "fields": self._zoned(options["fields"])})
            for title, options in super().get_fieldsets(request, obj)
        ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "<path:object_id>/action/<str:name>/",
                self.admin_site.admin_view(self.object_action_view),
                name="{}_{}_object_action".format(*info),
            ),
            *super().get_urls(),
        ]

    def action_allowed(self, request: HttpRequest, name: str) -> bool:
        """Whether the user holds every permission the action ``name`` declares."""
        func = getattr(self, name, None)
        if name not in self.object_actions or func is None:
            return False
        return all(
            getattr(self, f"has_{permission}_permission")(request)
            for permission in getattr(func, "allowed_permissions", ())
        )

    def available_object_actions(
        self, request: HttpRequest, obj: Any
    ) -> list[tuple[str, str]]:  # (name, label)
        """The detail page's buttons for ``obj``: actions allowed to this user and fitting ``obj``."""
        fits = getattr(self, "object_action_fits", lambda obj, name: True)
        return [
            (name, str(getattr(self, name).short_description))
            for name in self.object_actions
            if self.action_allowed(request, name) and fits(obj, name)
        ]

    @cached_property
    def _post_only(self) -> Callable[..., HttpResponse]:
        return require_POST(self._object_action)

    def object_action_view(self, request: HttpRequest, object_id: str, name: str) -> HttpResponse:
        """Run one action on one object (POST only; 403 without its permissions)."""
        return self._post_only(request, object_id, name)

    def _object_action(self, request: HttpRequest, object_id: str, name: str) -> HttpResponse:
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404(f"No {self.opts.verbose_name} with the key {object_id!r}.")
        if not self.has_view_permission(request, obj) or not self.action_allowed(request, name):
            raise PermissionDenied
        getattr(self, name)(request, self.get_queryset(request).filter(pk=obj.pk))
        info = self.opts.app_label, self.opts.model_name
        return HttpResponseRedirect(
            reverse(
                "admin:{}_{}_change".format(*info), args=[obj.pk], current_app=self.admin_site.name
            )
        )

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        if obj is not None:
            context["object_actions"] = self.available_object_actions(request, obj)
            info = self.opts.app_label, self.opts.model_name
            context["object_action_url"] = "admin:{}_{}_object_action".format(*info)
        return super().render_change_form(request, context, add, change, form_url, obj)


def table_estimate(model: type[models.Model], using: str) -> int | None:
    """The planner's row estimate for ``model``'s whole table, or None where there is none
    (SQLite; see :func:`django_tasks_coord.db.table_rows`)."""
    return db.table_rows(connections[using], model._meta.db_table)


class EstimatedCountPaginator(AnyPaginator):
    """A paginator that never counts a whole large table.

    Unfiltered, it takes the planner's estimate (PostgreSQL, MySQL/MariaDB) when that
    is at least :attr:`exact_below` rows, and counts exactly otherwise (or on SQLite).
    Filtered, it counts at most :attr:`cap` + 1 rows: past the cap the list says "more
    than" and the page links stop there (narrow the filter to go further).
    """

    exact_below = 10_000
    cap = 10_000

    estimated = False
    capped = False

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, models.QuerySet):
            return len(qs)
        if not qs.query.where:
            estimate = table_estimate(qs.model, qs.db)
            if estimate is not None and estimate >= self.exact_below:
                self.estimated = True
                return estimate
            return qs.count()
        counted = qs.order_by()[: self.cap + 1].count()
        if counted > self.cap:
            self.capped = True
            return self.cap
        return counted


class InputFilter(admin.SimpleListFilter):
    """A list filter that is a text box (for values too many to list), matched exactly."""

    template = "admin/django_tasks_coord/input_filter.html"
    field: str = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        return True

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value:
            return queryset.filter(**{self.field: value})
        return queryset

    def choices(self, changelist: Any) -> Iterator[Any]:
        # The template needs the other parameters (kept as hidden inputs) and the value.
        params = {
            k: v for k, v in changelist.get_filters_params().items() if k != self.parameter_name
        }
        if changelist.query:
            params["q"] = [changelist.query]
        yield {
            "value": self.value() or "",
            "parameter_name": self.parameter_name,
            "params": params,
            "clear_url": changelist.get_query_string(remove=[self.parameter_name]),
        }


def age(delta: timedelta | None) -> str:
    """A heartbeat or waiting age for people: ``"4s"``, ``"12m 5s"``, ``"3h 2m"``, ``"2d 4h"``."""
    if delta is None:
        return "-"
    seconds = max(int(delta.total_seconds()), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def alive_badge(alive: bool) -> str:
    """A green "alive" or red "dead" label."""
    return format_html(
        '<span class="tc-badge tc-{}">{}</span>',
        "ok" if alive else "bad",
        gettext_lazy("alive") if alive else gettext_lazy("dead"),
    )
