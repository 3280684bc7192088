"""The metrics view: the queue's state for Prometheus, read from the database per scrape.

Mount it with the app's URLs (``path("tasks/", include("django_tasks_coord.urls"))``
serves it at ``/tasks/metrics``), or on its own
(``path("metrics", django_tasks_coord.metrics.views.metrics)``). Importing this module
without ``prometheus_client`` raises :class:`~django_tasks_coord.exceptions.ConfigurationError`.

Who may read it (``TASKS_COORD["METRICS_PUBLIC"]``):

- ``None`` (the default): anyone while ``DEBUG`` is on; otherwise only a user with the
  ``django_tasks_coord.view_metrics`` permission (superusers have it), logged in (the
  admin's session) or through an API token (``Authorization: Bearer <token>``, see
  :mod:`django_tasks_coord.api.auth`; Prometheus' ``authorization`` scrape option).
- ``True``: anyone (a port that only Prometheus reaches).
- ``False``: only such a user, even under ``DEBUG``.

Anonymous requests get 401, users without the permission 403. The metrics carry topic
names, states, node ids, group names and job ids: never a payload, result or error.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from django_tasks_coord.api.auth import AuthenticationFailed, authenticate
from django_tasks_coord.conf import app_settings
from django_tasks_coord.metrics import require

require()

from prometheus_client import CollectorRegistry, exposition  # noqa: E402

from django_tasks_coord.metrics.collector import QueueStateCollector  # noqa: E402

#: The permission that lets a user (or its API token) read the metrics.
PERMISSION = "django_tasks_coord.view_metrics"


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None if ``request`` may read the metrics, else the 401 or 403 to send."""
    public = app_settings.METRICS_PUBLIC
    if public or (public is None and settings.DEBUG):
        return None
    header = request.headers.get("Authorization")
    if header:
        try:
            user = authenticate(header)
        except AuthenticationFailed as exc:
            return _unauthorized(str(exc))
    else:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return _unauthorized(
                "Log in, or send an API token ('Authorization: Bearer <token>') of a user "
                f"with the {PERMISSION} permission."
            )
    if not user.has_perm(PERMISSION):
        return HttpResponse(
            f"This user lacks the {PERMISSION} permission.\n", status=403, content_type="text/plain"
        )
    return None


def _unauthorized(message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="tasks_coord metrics"'
    return response


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The queue-state metrics in Prometheus' text format (or OpenMetrics, if asked)."""
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueStateCollector())
    encoder, content_type = exposition.choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry), content_type=content_type)
