"""The HTTP API's views: JSON in, JSON out, errors as ``{"error": {"code", "message", "path"?}}``.

Each view is registered for an operation of :data:`~django_tasks_coord.api.openapi.OPERATIONS`
with :func:`~django_tasks_coord.api.handling.operation`, which does what every operation
does around its view (see :mod:`django_tasks_coord.api.handling`: size, token,
permission, content type and body checks, and the service's exceptions as JSON
errors); the names ``urls.py`` routes with are re-exported here. Views are
CSRF-exempt: they take no cookies, only tokens.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_tasks_coord import definitions, execution_batches, executions
from django_tasks_coord.api import openapi
from django_tasks_coord.api.handling import (
    VIEWS,
    ApiError,
    as_api_error,
    authorize,
    is_coroutine,
    no_such_endpoint,
    operation,
    too_large,
    without_body_for_head,
)
from django_tasks_coord.api.longpoll import first_attempt, long_poll
from django_tasks_coord.enums import UNSET
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task

__all__ = [
    "VIEWS",
    "ApiError",
    "definition_json",
    "is_coroutine",
    "no_such_endpoint",
    "openapi_document",
    "operation",
    "task_json",
    "too_large",
    "without_body_for_head",
]


# --- representation --------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def task_json(task: Task, now: datetime | None = None) -> dict[str, Any]:
    """The API's representation of a task (schema ``Task`` of the OpenAPI document)."""
    status, outcome = executions.status(task, now)
    return {
        "id": task.pk,
        "definition": task.topic_id,
        "status": status.value,
        "outcome": outcome.value if outcome else None,
        "outcome_reason": task.outcome_reason or None,
        "params": task.payload,
        "result": task.result,
        "error": task.error_detail,
        "label": task.label,
        "requester": task.requester,
        "priority": task.priority,
        "attempts": task.attempts,
        "retry_count": executions.retry_count(task),
        "exec_id": str(task.exec_id) if task.exec_id else None,
        "execute_at": _iso(task.execute_at),
        "deadline": _iso(task.deadline),
        "created_at": _iso(task.created_at),
        "started_at": _iso(task.started_at),
        "finished_at": _iso(task.finished_at),
        "traceparent": task.traceparent,
        "cancel_requested": task.cancel_requested_at is not None,
        "progress": task.progress,
    }


def _tasks(tasks: list[Task]) -> dict[str, Any]:
    now = executions.clock()
    return {"tasks": [task_json(task, now) for task in tasks]}


def definition_json(definition: definitions.Definition) -> dict[str, Any]:
    """The API's representation of a definition (schema ``Definition``)."""
    return {"name": definition.name, **definition.row_fields()}


# --- executor operations -----------------------------------------------------------------------


@operation("poll")
def poll(request: HttpRequest, user: Any, body: dict[str, Any]) -> Any:
    return _tasks(executions.poll(body["definitions"], _int(body, "limit", 1)))


def _first_attempt(start: bool, timeout: float) -> Any:
    """The first attempt to claim of a long-poll or claim, made with its checks."""

    def attempt(request: HttpRequest, user: Any, body: dict[str, Any]) -> Any:
        limit, wait = _int(body, "limit", 1), body.get("timeout", timeout)
        return first_attempt(body["definitions"], limit, wait, start)

    return attempt


@operation("longPoll", first=_first_attempt(start=False, timeout=30))
async def long_poll_view(request: HttpRequest, user: Any, body: dict[str, Any], first: Any) -> Any:
    # The token may be revoked (or the permission withdrawn) while the poll waits: each claim
    # after a wait checks them again first, so that no task goes to a token no longer valid.
    tasks = await long_poll(
        body["definitions"],
        _int(body, "limit", 1),
        body.get("timeout", 30),
        authorize=functools.partial(authorize, request, openapi.BY_ID["longPoll"]),
        first=first,
    )
    return _tasks(tasks)


@operation("claim", first=_first_attempt(start=True, timeout=0))
async def claim(request: HttpRequest, user: Any, body: dict[str, Any], first: Any) -> Any:
    tasks = await long_poll(
        body["definitions"],
        _int(body, "limit", 1),
        body.get("timeout", 0),
        authorize=functools.partial(authorize, request, openapi.BY_ID["claim"]),
        start=True,
        first=first,
    )
    return _tasks(tasks)


@operation("complete")
def complete(request: HttpRequest, user: Any, body: dict[str, Any]) -> Any:
    reports = [
        execution_batches.Report(
            item["id"],
            _exec_id(item),
            succeeded=item["outcome"] == "succeeded",
            result=item.get("result"),
            error=item.get("error"),
            retry=item.get("retry", True),
        )
        for item in body["tasks"]
    ]
    now = executions.clock()
    completions = execution_batches.complete(reports, now=now)
    return {"results": [_completion_json(i, c, now) for i, c in enumerate(completions)]}


def _completion_json(
    index: int, completion: execution_batches.Completion, now: datetime
) -> dict[str, Any]:
    """One result of a batch completion: the task's new status, or the error of the report."""
    if completion.task is not None:
        status, outcome = executions.status(completion.task, now)
        return {
            "id": completion.report.task_id,
            "ok": True,
            "status": status.value,
            "outcome": outcome.value if outcome else None,
        }
    assert completion.error is not None
    error = as_api_error(completion.error)
    detail = {"code": error.code, "message": error.message}
    if error.path is not None:  # a pointer into the report's values
        detail["path"] = f"/tasks/{index}{error.path}"
    return {"id": completion.report.task_id, "ok": False, "error": detail}


def _int(body: dict[str, Any], key: str, default: int) -> int:
    """An integer of the body (JSON Schema's integers include 2.0)."""
    return int(body.get(key, default))


def _exec_id(body: dict[str, Any]) -> uuid.UUID:
    return uuid.UUID(body["exec_id"])  # the schema checked its format


@operation("start")
def start(request: HttpRequest, user: Any, body: dict[str, Any], task_id: int) -> Any:
    return task_json(executions.start(task_id, _exec_id(body)))


@operation("notify")
def notify(request: HttpRequest, user: Any, body: dict[str, Any], task_id: int) -> Any:
    progress = body.get("progress", UNSET)
    task = executions.notify(
        task_id, _exec_id(body), progress=progress, checkpoints=body.get("checkpoints")
    )
    return {**task_json(task), "checkpoints": executions.checkpoints_of(task)}


@operation("success")
def success(request: HttpRequest, user: Any, body: dict[str, Any], task_id: int) -> Any:
    return task_json(executions.succeed(task_id, _exec_id(body), body.get("result")))


@operation("fail")
def fail(request: HttpRequest, user: Any, body: dict[str, Any], task_id: int) -> Any:
    task = executions.fail(
        task_id, _exec_id(body), body.get("error"), retry=body.get("retry", True)
    )
    return task_json(task)


# --- user operations ----------------------------------------------------------------------------


@operation("create")
def create(request: HttpRequest, user: Any, body: dict[str, Any]) -> Any:
    execute_at = None
    if "execute_at" in body:
        try:
            execute_at = parse_datetime(body["execute_at"])
        except ValueError:  # well formed, but no such time: minute 60, February 30...
            execute_at = None
        if execute_at is None or timezone.is_naive(execute_at):
            raise ApiError(
                400,
                "invalid_request",
                "execute_at must be an ISO 8601 date and time with a time zone, "
                f"e.g. 2030-01-01T09:00:00Z, not {body['execute_at']!r}.",
                "/execute_at",
            )
    task = executions.create(
        body["definition"],
        body.get("params"),
        execute_at=execute_at,
        label=body.get("label", ""),
        requester=user.get_username()[:255],
        priority=_int(body, "priority", 0),
    )
    return task_json(task)


def _query_int(
    request: HttpRequest, name: str, default: int | None, low: int, high: int
) -> int | None:
    raw = request.GET.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ApiError(
            400,
            "invalid_request",
            f"Query parameter {name} must be an integer from {low} to {high}.",
        )
    return value


@operation("list")
def list_tasks(request: HttpRequest, user: Any, body: dict[str, Any]) -> Any:
    limit = _query_int(request, "limit", 50, 1, openapi.MAX_PAGE)
    before = _query_int(request, "before", None, -(2**63), 2**63 - 1)
    try:
        qs = executions.tasks(
            request.GET.getlist("definition") or None,
            status=request.GET.get("status"),
            outcome=request.GET.get("outcome"),
        )
    except InvalidArgumentError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    if before is not None:
        qs = qs.filter(sequence__lt=before)
    assert limit is not None
    page = list(qs[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return {**_tasks(page), "next_before": page[-1].pk if more else None}


@operation("get")
def get(request: HttpRequest, user: Any, body: dict[str, Any], task_id: int) -> Any:
    task = executions.get(task_id)
    return {**task_json(task), "checkpoints": executions.checkpoints_of(task)}


@operation("cancel")
def cancel(request: HttpRequest, user: Any, body: dict[str, Any], task_id: int) -> Any:
    return task_json(executions.cancel(task_id))


@operation("definitions")
def definitions_view(request: HttpRequest, user: Any, body: dict[str, Any]) -> Any:
    names = sorted(definitions.names())
    return {"definitions": [definition_json(definitions.get(name)) for name in names]}


# --- the document ---------------------------------------------------------------------------------


def openapi_document(request: HttpRequest) -> HttpResponse:
    """The OpenAPI document (public, like any API description; it holds no data)."""
    if request.method not in ("GET", "HEAD"):
        response = ApiError(405, "method_not_allowed", "Use GET.").response()
        response["Allow"] = "GET, HEAD"
        return response
    base = reverse("tasks_coord_api:openapi").removesuffix("openapi.json").rstrip("/")
    return without_body_for_head(request, JsonResponse(openapi.document(base or "/")))
