"""How the HTTP API handles every request before and after its view.

:func:`operation` registers a view for an operation of
:data:`~django_tasks_coord.api.openapi.OPERATIONS` (in :data:`VIEWS`, filled as
:mod:`django_tasks_coord.api.views` declares its views; ``urls.py`` routes them). It
refuses a body over Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (413), authenticates the
bearer token (401), checks the operation's permission (403), refuses a body that is
not ``application/json`` (415), parses and validates the JSON body against the
operation's published schema and against what the database can store (400), and
turns the service's exceptions into JSON errors (404, 409, 422) with :class:`ApiError`.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import jsonschema
from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse, UnreadablePostError

from django_tasks_coord import db, definitions, tracing, validation
from django_tasks_coord.api import auth, openapi
from django_tasks_coord.api.threads import run_db
from django_tasks_coord.exceptions import (
    ExecutionConflictError,
    InvalidArgumentError,
    PayloadError,
    SchemaViolationError,
    UnknownDefinitionError,
)

__all__ = [
    "VIEWS",
    "ApiError",
    "as_api_error",
    "authorize",
    "is_coroutine",
    "no_such_endpoint",
    "operation",
    "too_large",
    "without_body_for_head",
]

View = Callable[..., HttpResponse]
AsyncView = Callable[..., Awaitable[HttpResponse]]


class ApiError(Exception):
    """An error response: HTTP ``status``, machine ``code``, human ``message``, optional ``path``."""

    def __init__(self, status: int, code: str, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.path = status, code, message, path

    def response(self) -> JsonResponse:
        error: dict[str, str] = {"code": self.code, "message": self.message}
        if self.path is not None:
            error["path"] = self.path
        response = JsonResponse({"error": error}, status=self.status)
        if self.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="tasks"'
        if self.status == 503:
            response["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
        return response


#: Seconds a client is asked to wait (``Retry-After``) when the database does not answer.
UNAVAILABLE_RETRY_AFTER = 1


def as_api_error(exc: Exception) -> ApiError:
    """The JSON error for an exception of the service layer (re-raises anything else)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, auth.AuthenticationFailed):
        return ApiError(401, "not_authenticated", str(exc))
    if isinstance(exc, PayloadError):
        return ApiError(400, "invalid_request", str(exc), exc.path)
    if isinstance(exc, SchemaViolationError):
        return ApiError(422, "schema_violation", str(exc), f"/{exc.document}{exc.path}")
    if isinstance(exc, UnknownDefinitionError):
        return ApiError(404, "unknown_definition", str(exc))
    if isinstance(exc, ObjectDoesNotExist):
        return ApiError(404, "not_found", str(exc))
    if isinstance(exc, ExecutionConflictError):
        return ApiError(409, exc.code, str(exc))
    if isinstance(exc, InvalidArgumentError):
        return ApiError(400, "invalid_request", str(exc))
    if isinstance(exc, DatabaseError) and db.connection_lost(exc):
        return ApiError(
            503, "database_unavailable", "The database does not answer; try again shortly."
        )
    raise exc


# --- request handling ------------------------------------------------------------------------


def authorize(request: HttpRequest, spec: openapi.Operation) -> Any:
    """The user of the request's bearer token (401), if it has the operation's permission (403)."""
    definitions.prepare()
    user, allowed = auth.authorized(request.headers.get("Authorization"), spec.permissions)
    if not allowed:
        raise ApiError(
            403,
            "permission_denied",
            f"User {user.get_username()!r} needs the permission "
            + " or ".join(repr(p) for p in spec.permissions)
            + f" to {spec.id}.",
        )
    return user


_validators = {
    name: jsonschema.Draft202012Validator(
        {**schema, "components": {"schemas": openapi.SCHEMAS}},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )
    for name, schema in openapi.SCHEMAS.items()
}


def too_large() -> ApiError:
    """The 413 of a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``."""
    return ApiError(
        413,
        "body_too_large",
        f"The body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes "
        "(the server's DATA_UPLOAD_MAX_MEMORY_SIZE setting).",
    )


def _raw_body(request: HttpRequest) -> bytes:
    """The request body; 413 over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (Django checks it)."""
    try:
        return request.body
    except RequestDataTooBig:
        raise too_large() from None
    except UnreadablePostError as exc:
        raise ApiError(400, "invalid_request", f"The body could not be read: {exc}.") from None


def _check_content_type(request: HttpRequest, body: bytes) -> None:
    """A body must be ``application/json`` (UTF-8, the only charset JSON has): 415 otherwise."""
    charset = (request.content_params or {}).get("charset", "utf-8").lower()
    if body and (request.content_type != "application/json" or charset not in ("utf-8", "utf8")):
        raise ApiError(
            415,
            "unsupported_media_type",
            "Send the body as 'Content-Type: application/json' (UTF-8), not "
            f"{request.headers.get('Content-Type', 'without a Content-Type')!r}.",
        )


#: Bodies that nest lists and objects deeper than this are unreadable (``invalid_json``) on
#: every Python version; shallower ones past ``MAX_JSON_DEPTH`` are refused with the path of
#: the value (``invalid_request``).
UNREADABLE_DEPTH = 1400


def _nests_deeper(data: object, limit: int) -> bool:
    """Whether lists and dicts in ``data`` nest more than ``limit`` levels (no recursion)."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, list | dict):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return False


def _body(request: HttpRequest, spec: openapi.Operation, raw: bytes) -> dict[str, Any]:
    """The request's JSON body, checked against the operation's schema and what can be stored."""
    if spec.request is None:
        return {}
    _check_content_type(request, raw)
    too_deep = ApiError(
        400,
        "invalid_json",
        "The body nests lists and objects too deeply to be read; values may nest at most "
        f"{validation.MAX_JSON_DEPTH} levels.",
    )
    try:
        data = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"The body is not JSON: {exc}.") from None
    except RecursionError:
        raise too_deep from None
    # How deep CPython's parser goes before a RecursionError depends on its version (3.12:
    # about 1,500 levels; 3.13: 10,000): refuse the same bodies on every version.
    if raw.count(b"[") + raw.count(b"{") > UNREADABLE_DEPTH and _nests_deeper(
        data, UNREADABLE_DEPTH
    ):
        raise too_deep
    error = jsonschema.exceptions.best_match(_validators[spec.request].iter_errors(data))
    if error is not None:
        path = validation.json_pointer(error.absolute_path)
        raise ApiError(
            400,
            "invalid_request",
            f"The body does not match {spec.request}: {_message(error)}"
            + (f" (at {path})" if path else ""),
            path,
        )
    assert isinstance(data, dict)
    for pointer, value in _values(spec, data):  # too deep, NUL, lone surrogates: unstorable
        validation.check_json(value, pointer, pointer=pointer)
    return data


#: How much of a refused value an error message quotes (JSON Schema's messages quote it whole).
_QUOTED = 80
#: The validators whose limit an error message names.
_LIMITS = ("maxItems", "minItems", "maxProperties", "minProperties", "maxLength", "minLength")


def _message(error: jsonschema.ValidationError) -> str:
    """``error``'s message, without a large refused value quoted in full (a list of 10,000
    items is named by its size), and with the limit it broke, if any."""
    message, quoted = str(error.message), repr(error.instance)
    if len(quoted) > _QUOTED and message.startswith(quoted):
        instance = error.instance
        if isinstance(instance, dict):
            what = f"an object of {len(instance)} properties"
        elif isinstance(instance, list):
            what = f"an array of {len(instance)} items"
        elif isinstance(instance, str):
            what = f"a string of {len(instance)} characters"
        else:
            what = quoted[:_QUOTED] + "..."
        message = what + message[len(quoted) :]
    if error.validator in _LIMITS:
        message += f" ({error.validator}: {error.validator_value})"
    return message


def _values(spec: openapi.Operation, data: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """The values of a body that are stored, by JSON Pointer: the body's own, or in a batch
    completion those of each report."""
    if spec.request == "CompleteRequest":
        for index, report in enumerate(data["tasks"]):
            for name, value in report.items():
                yield f"/tasks/{index}/{name}", value
        return
    for name, value in data.items():
        yield f"/{name}", value


def _task_id(kwargs: dict[str, Any]) -> None:
    """Turn the ``task_id`` URL segment into an int in place; 404 if it cannot be an id."""
    if "task_id" not in kwargs:
        return
    raw = kwargs["task_id"]
    if raw.isdigit() and int(raw) < 2**63:
        kwargs["task_id"] = int(raw)
        return
    raise ApiError(404, "not_found", f"No task has the id {raw!r}.")


def no_such_endpoint(request: HttpRequest, rest: str) -> HttpResponse:
    """Anything else under the API's prefix: a JSON 404."""
    return ApiError(404, "not_found", f"The API has no endpoint {rest!r}.").response()


def _checked(
    request: HttpRequest, spec: openapi.Operation, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """What every operation checks first: the task id (404), the body's size (413), the token
    (401), the permission (403), the body's type (415) and content (400). Returns the user and
    the body."""
    _task_id(kwargs)
    raw = _raw_body(request) if spec.request is not None else b""
    user = authorize(request, spec)
    return user, _body(request, spec, raw)


def _checked_first(
    request: HttpRequest,
    spec: openapi.Operation,
    kwargs: dict[str, Any],
    first: Callable[[HttpRequest, Any, dict[str, Any]], Any] | None,
) -> tuple[Any, dict[str, Any], Any]:
    """:func:`_checked`, then ``first`` (see :func:`operation`)."""
    user, body = _checked(request, spec, kwargs)
    return user, body, None if first is None else first(request, user, body)


def operation(
    operation_id: str, *, first: Callable[[HttpRequest, Any, dict[str, Any]], Any] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a view for the operation ``operation_id``.

    The view receives ``(request, user, body, **url_kwargs)`` and returns a JSON-able
    value (status 200, or the operation's 201) or an ``HttpResponse``. A coroutine view
    stays a coroutine: authentication and body checks then run in one of the API's
    database threads, and so does ``first(request, user, body)`` right after them, if
    given, whose result the view receives as ``first=`` (a long-poll's first attempt to
    claim: one trip to a database thread, not two, when work is ready).
    """
    spec = openapi.BY_ID[operation_id]
    status = 201 if 201 in spec.responses else 200

    def respond(value: Any) -> HttpResponse:
        if isinstance(value, HttpResponse):
            return value
        return JsonResponse(value, status=status, safe=False)

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        if is_coroutine(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, **kwargs: Any) -> HttpResponse:
                try:
                    user, body, done = await run_db(_checked_first, request, spec, kwargs, first)
                    if first is not None:
                        kwargs["first"] = done
                    return respond(await view(request, user, body, **kwargs))
                except Exception as exc:  # noqa: BLE001 - mapped or re-raised
                    return as_api_error(exc).response()

            VIEWS[operation_id] = async_wrapper
            return async_wrapper

        @functools.wraps(view)
        def wrapper(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            try:
                user, body = _checked(request, spec, kwargs)
                traceparent = request.headers.get("traceparent")  # docs/tracing.md
                with tracing.api_call(traceparent, operation_id, kwargs.get("task_id")):
                    return respond(view(request, user, body, **kwargs))
            except Exception as exc:  # noqa: BLE001 - mapped or re-raised
                return as_api_error(exc).response()

        VIEWS[operation_id] = wrapper
        return wrapper

    return decorate


def is_coroutine(view: Callable[..., Any]) -> bool:
    """Whether ``view`` is an async view."""
    return inspect.iscoroutinefunction(view)


#: The registered views by operation id (``urls.py`` routes them).
VIEWS: dict[str, Callable[..., Any]] = {}


def without_body_for_head(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """``response`` as the answer to a HEAD request: the GET's headers (its length
    included), no body. Other methods' responses are returned as they are."""
    if request.method == "HEAD" and not response.streaming:
        length = len(response.content)
        response.content = b""
        response["Content-Length"] = str(length)
    return response
