"""Task definitions (the HTTP executors' task types), read-only: they are declared in code."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from django_tasks_coord.admin.base import ServiceActionsAdmin
from django_tasks_coord.admin.topics import task_list_url
from django_tasks_coord.models import Task, TaskDefinition


class DefinitionFilter(admin.SimpleListFilter):
    """Tasks of one definition, i.e. of the topic named after it (a topic-leading index serves it)."""

    title = _("definition")
    parameter_name = "definition"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in TaskDefinition.objects.values_list("name", flat=True)]

    def has_output(self) -> bool:
        # Shown (and applied) even with no definitions when a value is asked for: a filter
        # on a definition that does not exist must list nothing, not everything.
        return bool(self.lookup_choices) or self.value() is not None

    def queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> QuerySet[Task]:
        value = self.value()
        return queryset.filter(topic_id=value) if value else queryset


def _schema(value: Any) -> Any:
    if value is None:
        return "-"
    return format_html('<pre class="tc-pre">{}</pre>', json.dumps(value, indent=2, sort_keys=True))


@admin.register(TaskDefinition)
class TaskDefinitionAdmin(ServiceActionsAdmin):
    """Definitions as declared in code (``definitions.define``); change them there."""

    list_display = (
        "name",
        "declared",
        "requested_to_start_timeout",
        "in_progress_timeout",
        "allowed_retry_count",
        "retry_delay",
        "concurrency_limit",
        "tasks",
    )
    list_filter = ("declared",)
    search_fields = ("name",)
    fields = (
        "name",
        "description",
        "declared",
        ("requested_to_start_timeout", "in_progress_timeout"),
        ("allowed_retry_count", "retry_delay"),
        ("concurrency_limit", "concurrency_key_path"),
        "params_schema_json",
        "result_schema_json",
        "error_schema_json",
        ("created_at", "updated_at"),
        "tasks",
    )
    readonly_fields = (
        "name",
        "description",
        "declared",
        "requested_to_start_timeout",
        "in_progress_timeout",
        "allowed_retry_count",
        "retry_delay",
        "concurrency_limit",
        "concurrency_key_path",
        "params_schema_json",
        "result_schema_json",
        "error_schema_json",
        "created_at",
        "updated_at",
        "tasks",
    )

    @admin.display(description=_("tasks"))
    def tasks(self, obj: TaskDefinition) -> Any:
        return format_html('<a href="{}">{}</a>', task_list_url(definition=obj.name), _("Tasks"))

    @admin.display(description=_("params schema"))
    def params_schema_json(self, obj: TaskDefinition) -> Any:
        return _schema(obj.params_schema)

    @admin.display(description=_("result schema"))
    def result_schema_json(self, obj: TaskDefinition) -> Any:
        return _schema(obj.result_schema)

    @admin.display(description=_("error schema"))
    def error_schema_json(self, obj: TaskDefinition) -> Any:
        return _schema(obj.error_schema)
