"""Routes of the HTTP API, built from the operation table.

Mount it where you like; the documentation assumes::

    path("tasks/", include("django_tasks_coord.api.urls"))
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.views.decorators.csrf import csrf_exempt

from django_tasks_coord.api import views
from django_tasks_coord.api.openapi import OPERATIONS

app_name = "tasks_coord_api"


def _route(openapi_path: str) -> str:
    """The Django route of an OpenAPI path: ``/{task_id}/start`` → ``<str:task_id>/start``.

    Any segment is routed, so that an id that is not a number gets the API's JSON 404.
    """
    return openapi_path.lstrip("/").replace("{task_id}", "<str:task_id>")


def _dispatcher(route: str, handlers: dict[str, Any]) -> Any:
    """One view for a route that hands each method to its operation's view (405 otherwise).

    HEAD is answered like GET, without the body.
    """
    methods = {*handlers, "head"} if "get" in handlers else set(handlers)
    allowed = ", ".join(sorted(method.upper() for method in methods))

    def handler_of(request: HttpRequest) -> Any:
        method = (request.method or "").lower()
        return handlers.get("get" if method == "head" else method)

    def not_allowed(request: HttpRequest) -> HttpResponse:
        response = views.ApiError(
            405, "method_not_allowed", f"{request.method} is not allowed here; use {allowed}."
        ).response()
        response["Allow"] = allowed
        return response

    if any(views.is_coroutine(handler) for handler in handlers.values()):
        assert all(map(views.is_coroutine, handlers.values())), f"{route}: async and sync views"

        async def dispatch_async(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            handler = handler_of(request)
            if handler is None:
                return not_allowed(request)
            return views.without_body_for_head(request, await handler(request, **kwargs))

        view: Any = dispatch_async
    else:

        def dispatch(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            handler = handler_of(request)
            if handler is None:
                return not_allowed(request)
            return views.without_body_for_head(request, handler(request, **kwargs))

        view = dispatch
    view.allowed_methods = sorted(handlers)  # read by the OpenAPI sync test
    return csrf_exempt(view)


def _patterns() -> list[URLPattern]:
    routes: dict[str, dict[str, Any]] = {}
    for operation in OPERATIONS:
        routes.setdefault(operation.path, {})[operation.method] = views.VIEWS[operation.id]
    # Fixed routes first, so that "poll" is never read as a task id (it is not an int anyway).
    ordered = sorted(routes, key=lambda route: ("{" in route, route))
    patterns = [
        path(_route(route), _dispatcher(route, routes[route]), name=route) for route in ordered
    ]
    patterns.insert(0, path("openapi.json", views.openapi_document, name="openapi"))
    patterns.append(path("<path:rest>", views.no_such_endpoint))  # a JSON 404, not Django's page
    return patterns


urlpatterns = _patterns()
