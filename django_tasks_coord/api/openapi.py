"""The HTTP API's operations and their OpenAPI 3.1 document, from one table.

:data:`OPERATIONS` is the single source: ``urls.py`` builds its routes from it, the
views take their permission and request-body schema from it (bodies are validated with
exactly the schemas published here), and :func:`document` renders it. A test compares
the document with the URL configuration and with ``docs/openapi.json``. The bodies'
schemas are in :mod:`django_tasks_coord.api.schemas` (:data:`SCHEMAS`, re-exported here
with the limits they use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django_tasks_coord import __version__
from django_tasks_coord.api.schemas import (
    MAX_BATCH,
    MAX_PAGE,
    MAX_POLL,
    MAX_TIMEOUT,
    NAME,
    SCHEMAS,
)

EXECUTE = "django_tasks_coord.execute_tasks"
SUBMIT = "django_tasks_coord.submit_tasks"

__all__ = [
    "BY_ID",
    "EXECUTE",
    "MAX_BATCH",
    "MAX_PAGE",
    "MAX_POLL",
    "MAX_TIMEOUT",
    "OPERATIONS",
    "SCHEMAS",
    "SUBMIT",
    "Operation",
    "document",
]


@dataclass(frozen=True)
class Operation:
    """One endpoint: method and path (relative to where the API is mounted), who may call it,
    its request body schema (a name in :data:`SCHEMAS`), responses and query parameters."""

    id: str
    method: str
    path: str
    summary: str
    permissions: tuple[str, ...]
    responses: dict[int, tuple[str, str]]
    request: str | None = None
    query: tuple[dict[str, Any], ...] = ()
    description: str = ""
    tags: tuple[str, ...] = field(default=("executors",))
    #: OpenAPI links by response status: the operations a response's task can be passed to.
    links: dict[int, dict[str, Any]] = field(default_factory=dict)


_AUTH = {
    401: ("No valid bearer token.", "Error"),
    403: ("The token's user lacks the permission.", "Error"),
}
_BODY = {
    400: (
        "The body is not JSON, does not match the request schema, nests lists and objects "
        "more than 31 levels deep, or holds a string no database stores (a NUL character, a "
        "lone surrogate such as \\ud800); `path` is the JSON Pointer of the offending value.",
        "Error",
    ),
    413: (
        "The body is larger than the server's DATA_UPLOAD_MAX_MEMORY_SIZE Django setting "
        "(2.5 MB by default).",
        "Error",
    ),
    415: ("The body is not sent as `Content-Type: application/json` (UTF-8).", "Error"),
}
#: Every operation: the database did not answer (a restart, an outage).
_UNAVAILABLE = (
    "The database does not answer (a restart, an outage): nothing was done; try again after "
    "the `Retry-After` seconds.",
    "Error",
)
_TASK_ID = {404: ("No task of a definition has this id.", "Error")}
_CONFLICT = {409: ("Stale or wrong exec_id, or the task is not in that state.", "Error")}
_DEFINITION = {404: ("No task definition has this name.", "Error")}


def _task_link(operation_id: str, task: str, *, exec_id: bool = True) -> dict[str, Any]:
    """An OpenAPI link to ``operation_id`` for the task at the JSON Pointer ``task`` of the
    response body (with its exec_id in the request body, for the executor calls)."""
    link: dict[str, Any] = {
        "operationId": operation_id,
        "parameters": {"task_id": f"$response.body#{task}/id"},
    }
    if exec_id:
        link["requestBody"] = {"exec_id": f"$response.body#{task}/exec_id"}
    return link


#: What a handed-out task goes on to, and an in-progress one (what stateful clients and
#: schemathesis' stateful run follow).
_HANDED_OUT = {200: {"start": _task_link("start", "/tasks/0")}}
_IN_PROGRESS = {200: {name: _task_link(name, "") for name in ("notify", "success", "fail")}}
#: What a claimed task goes on to: the single calls, or a batch completion.
_CLAIMED = {
    200: {
        **{name: _task_link(name, "/tasks/0") for name in ("notify", "success", "fail")},
        "complete": {
            "operationId": "complete",
            "requestBody": {
                "tasks": [
                    {
                        "id": "$response.body#/tasks/0/id",
                        "exec_id": "$response.body#/tasks/0/exec_id",
                        "outcome": "succeeded",
                    }
                ]
            },
        },
    }
}

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "poll",
        "post",
        "/poll",
        "Hand out ready tasks of the given definitions (now requested).",
        (EXECUTE,),
        {200: ("The tasks handed out, each with its exec_id; possibly none.", "Tasks")}
        | _BODY
        | _AUTH
        | _DEFINITION,
        request="PollRequest",
        links=_HANDED_OUT,
    ),
    Operation(
        "longPoll",
        "post",
        "/long-poll",
        "Like poll, but wait up to `timeout` seconds for work.",
        (EXECUTE,),
        {200: ("The tasks handed out; none after the timeout.", "Tasks")}
        | _BODY
        | _AUTH
        | _DEFINITION,
        request="LongPollRequest",
        links=_HANDED_OUT,
    ),
    Operation(
        "claim",
        "post",
        "/claim",
        "Hand out and start ready tasks of the given definitions, in one call.",
        (EXECUTE,),
        {200: ("The tasks claimed, each in progress with its exec_id; possibly none.", "Tasks")}
        | _BODY
        | _AUTH
        | _DEFINITION,
        request="ClaimRequest",
        description="Poll and start in one call: up to `limit` tasks, each in progress "
        "(its attempt begun, its deadline the in-progress timeout) under a fresh exec_id. "
        "With `timeout`, it waits for work like a long-poll.",
        links=_CLAIMED,
    ),
    Operation(
        "start",
        "post",
        "/{task_id}/start",
        "Start a requested task: it is in progress until its in-progress timeout.",
        (EXECUTE,),
        {200: ("The task, in progress.", "Task")} | _BODY | _AUTH | _TASK_ID | _CONFLICT,
        request="ExecRequest",
        links=_IN_PROGRESS,
    ),
    Operation(
        "notify",
        "post",
        "/{task_id}/notify",
        "Heartbeat: the in-progress timeout starts again; report progress, learn of a cancel.",
        (EXECUTE,),
        {200: ("The task, with its new deadline; `cancel_requested`: stop, report.", "Task")}
        | _BODY
        | _AUTH
        | _TASK_ID
        | _CONFLICT,
        request="NotifyRequest",
        description="Call it more often than the in-progress timeout. With `progress`, "
        "the task's progress is stored (the task read shows it); with `checkpoints`, steps "
        "done are stored for a later attempt to skip (the answer returns them all). When a user cancels the "
        "task while it runs, the answer carries `cancel_requested: true`: stop the work and "
        "call success or fail; the task ends canceled whatever you report (or at its "
        "in-progress timeout if you report nothing).",
        links=_IN_PROGRESS,
    ),
    Operation(
        "success",
        "post",
        "/{task_id}/success",
        "Finish an in-progress task with its result.",
        (EXECUTE,),
        {200: ("The task, done.", "Task")}
        | _BODY
        | _AUTH
        | _TASK_ID
        | _CONFLICT
        | {422: ("The result does not match the result schema.", "Error")},
        request="SuccessRequest",
    ),
    Operation(
        "fail",
        "post",
        "/{task_id}/fail",
        "Report a failed attempt: retried after the retry delay while retries remain.",
        (EXECUTE,),
        {200: ("The task, waiting for its retry or done.", "Task")}
        | _BODY
        | _AUTH
        | _TASK_ID
        | _CONFLICT
        | {422: ("The error does not match the error schema.", "Error")},
        request="FailRequest",
    ),
    Operation(
        "complete",
        "post",
        "/complete",
        "Report the outcomes of many executions in one call.",
        (EXECUTE,),
        {200: ("One result per report, in order: accepted, or refused and why.", "Completions")}
        | _BODY
        | _AUTH,
        request="CompleteRequest",
        description=f"Up to {MAX_BATCH} reports, each a success (with its result) or a "
        "failure (with its error, retried while retries remain unless `retry` is false), "
        "checked like the single calls and accepted or refused on its own: a stale "
        "exec_id, a task that is done or a result that violates its schema refuses that "
        "report only (`ok` false, with the error the single call would answer), and "
        "changes nothing for it. A body that is not valid as a whole (400, 413, 415) "
        "changes nothing at all.",
    ),
    Operation(
        "create",
        "post",
        "/",
        "Create a task of a definition.",
        (SUBMIT,),
        {201: ("The task, waiting or ready.", "Task")}
        | _BODY
        | _AUTH
        | _DEFINITION
        | {422: ("The params do not match the params schema.", "Error")},
        request="CreateRequest",
        tags=("users",),
        links={
            201: {
                "get": _task_link("get", "", exec_id=False),
                "cancel": _task_link("cancel", "", exec_id=False),
            }
        },
    ),
    Operation(
        "list",
        "get",
        "/",
        "List tasks, newest first, a page at a time.",
        (SUBMIT, EXECUTE),
        {200: ("A page of tasks.", "TaskPage")}
        | {400: ("A query parameter is invalid.", "Error")}
        | _AUTH
        | _DEFINITION,
        query=(
            {
                "name": "definition",
                "in": "query",
                "description": "Only tasks of this definition (repeatable).",
                "schema": {"type": "array", "items": NAME},
                "style": "form",
                "explode": True,
            },
            {
                "name": "status",
                "in": "query",
                "schema": {
                    "type": "string",
                    "enum": ["waiting", "ready", "requested", "in_progress", "done"],
                },
            },
            {
                "name": "outcome",
                "in": "query",
                "schema": {"type": "string", "enum": ["succeeded", "failed", "canceled"]},
            },
            {
                "name": "limit",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 50},
            },
            {
                "name": "before",
                "in": "query",
                "description": "Only tasks with a smaller id (the previous page's next_before).",
                "schema": {"type": "integer"},
            },
        ),
        tags=("users",),
    ),
    Operation(
        "get",
        "get",
        "/{task_id}",
        "Read one task.",
        (SUBMIT, EXECUTE),
        {200: ("The task.", "Task")} | _AUTH | _TASK_ID,
        tags=("users",),
    ),
    Operation(
        "cancel",
        "post",
        "/{task_id}/cancel",
        "Cancel a task that is not done; an in-progress one is asked to stop.",
        (SUBMIT,),
        {200: ("The task: done and canceled, or in progress and `cancel_requested`.", "Task")}
        | _AUTH
        | _TASK_ID
        | {409: ("The task is already done.", "Error")},
        description="A task that is not in progress ends canceled at once, and a requested "
        "task's executor is refused from then on. An in-progress task is asked to stop: its "
        "executor learns it in the answer to its next notify, and the task ends canceled "
        "whatever the executor reports next (or at its in-progress timeout).",
        tags=("users",),
    ),
    Operation(
        "definitions",
        "get",
        "/definitions",
        "The task definitions, with their settings and JSON Schemas.",
        (SUBMIT, EXECUTE),
        {200: ("Every definition.", "Definitions")} | _AUTH,
        tags=("users", "executors"),
    ),
)

BY_ID = {operation.id: operation for operation in OPERATIONS}


def _parameters(operation: Operation) -> list[dict[str, Any]]:
    parameters = list(operation.query)
    if "{task_id}" in operation.path:
        parameters.insert(
            0,
            {
                "name": "task_id",
                "in": "path",
                "required": True,
                "schema": {"type": "integer", "minimum": 0},
            },
        )
    return parameters


def _operation(operation: Operation) -> dict[str, Any]:
    rendered: dict[str, Any] = {
        "operationId": operation.id,
        "summary": operation.summary,
        "tags": list(operation.tags),
        "description": (f"{operation.description}\n\n" if operation.description else "")
        + "Needs the permission "
        + " or ".join(f"`{p}`" for p in operation.permissions)
        + ".",
        "responses": {
            str(code): {
                "description": text,
                **(
                    {
                        "content": {
                            "application/json": {
                                "schema": {"$ref": f"#/components/schemas/{schema}"}
                            }
                        }
                    }
                    if schema
                    else {}
                ),
                **({"links": operation.links[code]} if code in operation.links else {}),
            }
            for code, (text, schema) in sorted({**operation.responses, 503: _UNAVAILABLE}.items())
        },
    }
    parameters = _parameters(operation)
    if parameters:
        rendered["parameters"] = parameters
    if operation.request:
        rendered["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"$ref": f"#/components/schemas/{operation.request}"}
                }
            },
        }
    return rendered


def document(server_url: str = "/tasks") -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API mounted at ``server_url``."""
    paths: dict[str, dict[str, Any]] = {}
    for operation in OPERATIONS:
        paths.setdefault(operation.path, {})[operation.method] = _operation(operation)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "django-tasks-coord executor API",
            "version": __version__,
            "description": "Create tasks of task definitions and run them from executors in "
            "any language. See docs/executors.md.",
        },
        "servers": [{"url": server_url}],
        "security": [{"bearerAuth": []}],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token from `manage.py tasks_coord_createapitoken` or the admin.",
                }
            },
        },
    }


if __name__ == "__main__":  # python -m django_tasks_coord.api.openapi > docs/openapi.json
    import json

    print(json.dumps(document(), indent=2))
