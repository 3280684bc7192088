"""Serve the HTTP API beside Django's request handling: lean calls on persistent
connections, and long-polls that cost no thread while they wait.

:func:`serve_api` serves every call of the API mounted at a prefix itself, each in one of
the API's database threads (:mod:`~django_tasks_coord.api.threads`), which keep their
database connections between calls by ``CONN_MAX_AGE`` (Django's own ASGI handling runs
each request in a thread of its own, whose connection cannot outlive it), and without the
middleware: the API takes bearer tokens, not cookies, and answers JSON. Everything else
goes to Django as before::

    # mysite/asgi.py
    from django.core.asgi import get_asgi_application

    from django_tasks_coord.api.asgi import serve_api

    application = serve_api(get_asgi_application(), prefix="/tasks/")

:func:`serve_long_polls` does it for the long-poll path alone (its waits are served beside
the middleware, the other calls by Django).

Django runs every synchronous middleware hook of an ASGI request (Django's own included) in a
thread of that request's own, kept until the response is sent: a thousand waiting long-polls
would be a thousand idle threads. The views served here authenticate and check by
themselves; nothing of the session, CSRF or security middleware applies to them. A client
that disconnects ends its wait at once. The body is read whole, up to Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` like any other request's; a larger one is answered at once
with the API's JSON 413, unread.
"""

from __future__ import annotations

import asyncio
import functools
import io
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from types import ModuleType
from typing import Any

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse
from django.urls import ResolverMatch, resolve

from django_tasks_coord.api.openapi import OPERATIONS
from django_tasks_coord.api.threads import run_db

logger = logging.getLogger("django.request")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _views() -> ModuleType:
    """The API's views, imported once Django is set up (a project's asgi.py imports this
    module before ``get_asgi_application()`` sets Django up)."""
    from django_tasks_coord.api import views

    return views


#: The names of the API's routes that are operations (``urls.py`` names them by path).
_OPERATION_ROUTES = frozenset(operation.path for operation in OPERATIONS)


def _operation(path: str, prefix: str) -> ResolverMatch | None:
    """The API operation that ``path`` calls, or None: outside ``prefix``, a route that is no
    operation, or a task id that is no number (``tasks/metrics`` is not a task)."""
    if not path.startswith(prefix):
        return None
    match = resolve(path[len(prefix) - 1 :], urlconf="django_tasks_coord.api.urls")
    if match.url_name not in _OPERATION_ROUTES:
        return None
    task_id = match.kwargs.get("task_id")
    return match if task_id is None or str(task_id).isdigit() else None


def serve_api(application: ASGIApp, prefix: str = "/tasks/") -> ASGIApp:
    """``application``, with the HTTP requests for the API mounted at ``prefix`` (as in
    ``path("tasks/", include("django_tasks_coord.api.urls"))``) served directly: each call
    in one of the API's database threads, long-polls and waiting claims as coroutines.
    Everything else goes to ``application``: paths outside ``prefix``, and under it those of
    no operation (the OpenAPI document, the metrics view of ``django_tasks_coord.urls``, and
    unknown paths, which the API's own URLs answer with a JSON 404)."""
    prefix = "/" + prefix.strip("/") + "/"

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        match = _operation(path, prefix)
        if match is None:
            await application(scope, receive, send)
            return
        body = await _body_or_413(scope, receive, send)
        if body is None:
            return
        request = ASGIRequest(scope, io.BytesIO(body))
        response: HttpResponse | None
        try:
            if _views().is_coroutine(match.func):
                response = await _until_disconnect(match.func(request, **match.kwargs), receive)
            else:
                response = await run_db(functools.partial(match.func, request, **match.kwargs))
        except Exception:
            logger.exception("Internal Server Error: %s", path, extra={"status_code": 500})
            response = (
                _views()
                .ApiError(
                    500, "server_error", "The server failed to answer; the call may be retried."
                )
                .response()
            )
        if response is not None:  # None: the client left
            await _send(send, response)

    return app


def serve_long_polls(application: ASGIApp, path: str = "/tasks/long-poll") -> ASGIApp:
    """``application``, with HTTP requests for ``path`` served by the long-poll view directly."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != path:
            await application(scope, receive, send)
            return
        body = await _body_or_413(scope, receive, send)
        if body is None:
            return
        response = await _until_disconnect(_respond(scope, body), receive)
        if response is not None:
            await _send(send, response)

    return app


async def _body_or_413(scope: Scope, receive: Receive, send: Send) -> bytes | None:
    """The request's body; None if the client left, or if it was over the size limit (the
    JSON 413 is sent then)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        if limit is not None and _declared_length(scope) > limit:
            raise _TooLarge
        return await _read_body(receive, limit)
    except _TooLarge:
        await _send(send, _views().too_large().response())
        return None


async def _send(send: Send, response: HttpResponse) -> None:
    headers = [  # lowercase, as ASGI asks
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.items()
    ]
    if not response.has_header("Content-Length"):  # else the server chunks the body
        headers.append((b"content-length", str(len(response.content)).encode()))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})


def _declared_length(scope: Scope) -> int:
    """The request's Content-Length (0 if it has none or a malformed one)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


class _TooLarge(Exception):
    """The body is larger than the limit."""


async def _read_body(receive: Receive, limit: int | None) -> bytes | None:
    """The whole request body, however many messages it comes in; None if the client left.

    Raises :class:`_TooLarge` as soon as more than ``limit`` bytes came (None: no limit).
    """
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(scope: Scope, body: bytes) -> HttpResponse:
    views = _views()
    if scope["method"] != "POST":
        response: HttpResponse = views.ApiError(405, "method_not_allowed", "Use POST.").response()
        response["Allow"] = "POST"
        return response
    request = ASGIRequest(scope, io.BytesIO(body))
    view: Callable[[ASGIRequest], Awaitable[HttpResponse]] = views.VIEWS["longPoll"]
    result: HttpResponse = await view(request)
    return result


async def _until_disconnect(work: Awaitable[HttpResponse], receive: Receive) -> HttpResponse | None:
    """Await ``work``; cancel it and return None if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(receive())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        return None
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
