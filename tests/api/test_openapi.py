"""The OpenAPI document matches the code: the routes, the methods, the published copy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.urls import URLPattern

from django_tasks_coord.api import openapi, urls

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def routed() -> set[tuple[str, str]]:
    """(OpenAPI path, method) for every route of the URL configuration."""
    found = set()
    for pattern in urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        route = str(pattern.pattern)
        if route in ("openapi.json", "<path:rest>"):
            continue
        path = "/" + route.replace("<str:task_id>", "{task_id}")
        for method in pattern.callback.allowed_methods:
            found.add((path, method))
    return found


def test_every_route_is_documented_and_every_documented_operation_routed():
    document = openapi.document()
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert documented == routed()


def test_every_operation_has_a_view_and_documents_the_errors_of_its_checks():
    for operation in openapi.OPERATIONS:
        assert operation.id in urls.views.VIEWS
        assert {401, 403} <= set(operation.responses), operation.id
        if operation.request:
            assert 400 in operation.responses, operation.id
        if "{task_id}" in operation.path:
            assert 404 in operation.responses, operation.id


def test_the_published_copy_is_up_to_date():
    """Regenerate it with: python -m django_tasks_coord.api.openapi > docs/openapi.json"""
    assert json.loads(DOCS.read_text()) == openapi.document()


@pytest.mark.django_db
def test_the_document_is_served_with_the_mount_point_as_server(client):
    response = client.get("/tasks/openapi.json")
    assert response.status_code == 200
    served = response.json()
    assert served["servers"] == [{"url": "/tasks"}]
    assert served == openapi.document("/tasks")
    assert served["openapi"].startswith("3.1")


def test_the_document_states_the_limits_the_server_applies():
    from django_tasks_coord import validation

    bad_body = openapi.document()["paths"]["/"]["post"]["responses"]["400"]["description"]
    assert f"more than {validation.MAX_JSON_DEPTH} levels" in bad_body
    assert all(
        {"400", "413", "415"} <= set(operation["responses"])
        for item in openapi.document()["paths"].values()
        for operation in item.values()
        if "requestBody" in operation
    )
