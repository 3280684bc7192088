"""Serve long-polls beside Django's middleware, so that a waiting executor costs no thread.

Django runs every synchronous middleware hook of an ASGI request (Django's own included) in a
thread of that request's own, kept until the response is sent: a thousand waiting long-polls
would be a thousand idle threads. Wrapping the ASGI application hands the long-poll path
straight to the long-poll view, which authenticates, checks and waits by itself; everything
else goes to Django as before::

    # mysite/asgi.py
    from django.core.asgi import get_asgi_application

    from django_tasks_coord.api.asgi import serve_long_polls

    application = serve_long_polls(get_asgi_application(), path="/tasks/long-poll")

The view then sees no middleware: nothing of the session, CSRF or security middleware applies
to that one path (it takes a bearer token, not cookies). A client that disconnects ends its
wait at once. The body is read whole, up to Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` like any
other request's; a larger one is answered at once with the API's JSON 413, unread.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def serve_long_polls(application: ASGIApp, path: str = "/tasks/long-poll") -> ASGIApp:
    """``application``, with HTTP requests for ``path`` served by the long-poll view directly."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != path:
            await application(scope, receive, send)
            return
        from django_tasks_coord.api import views

        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            if limit is not None and _declared_length(scope) > limit:
                raise _TooLarge
            body = await _read_body(receive, limit)
        except _TooLarge:
            await _send(send, views.too_large().response())
            return
        if body is None:
            return  # the client left before it finished sending
        response = await _until_disconnect(_respond(scope, body), receive)
        if response is not None:
            await _send(send, response)

    return app


async def _send(send: Send, response: HttpResponse) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": [
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in response.items()
            ],
        }
    )
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
    from django_tasks_coord.api import views

    if scope["method"] != "POST":
        response = views.ApiError(405, "method_not_allowed", "Use POST.").response()
        response["Allow"] = "POST"
        return response
    request = ASGIRequest(scope, io.BytesIO(body))
    view = views.VIEWS["longPoll"]
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
