"""API tokens in the admin: issued through the service (shown once, stored as a digest), revoked by deleting."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages

from django_tasks_coord.api.auth import AuthenticationFailed, authenticate
from django_tasks_coord.models import ApiToken

pytestmark = pytest.mark.django_db
URL = "/admin/django_tasks_coord/apitoken/"


def test_adding_a_token_issues_it_once_and_stores_only_its_digest(admin_client, superuser):
    response = admin_client.post(f"{URL}add/", {"user": superuser.pk, "name": "go-executor"})
    assert response.status_code == 302
    (message,) = [str(m) for m in get_messages(response.wsgi_request) if "copy it now" in str(m)]
    token = re.search(r" is (\S+) — copy it now", message).group(1)
    row = ApiToken.objects.get()
    assert (row.user, row.name) == (superuser, "go-executor")
    assert token not in (row.digest, row.prefix) and token.startswith(row.prefix)
    assert authenticate(f"Bearer {token}") == superuser
    assert LogEntry.objects.filter(object_id=str(row.pk)).exists()
    assert token in admin_client.get(URL).content.decode()  # the next page shows it, once
    page = admin_client.get(f"{URL}{row.pk}/change/").content.decode()
    assert row.prefix in page and token not in page and row.digest not in page


def test_deleting_a_token_revokes_it(admin_client, superuser):
    response = admin_client.post(f"{URL}add/", {"user": superuser.pk, "name": "x"})
    (message,) = [str(m) for m in get_messages(response.wsgi_request) if "copy it now" in str(m)]
    token = re.search(r" is (\S+) — copy it now", message).group(1)
    row = ApiToken.objects.get()
    response = admin_client.post(f"{URL}{row.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    with pytest.raises(AuthenticationFailed):
        authenticate(f"Bearer {token}")


def test_the_list_shows_tokens_without_secrets(admin_client, superuser):
    admin_client.post(f"{URL}add/", {"user": superuser.pk, "name": "shown"})
    page = admin_client.get(URL).content.decode()
    row = ApiToken.objects.get()
    assert "shown" in page and row.prefix in page and row.digest not in page


def test_a_viewer_cannot_issue_tokens(viewer_client, superuser):
    response = viewer_client.post(f"{URL}add/", {"user": superuser.pk, "name": "nope"})
    assert response.status_code == 403
    assert not ApiToken.objects.exists()
