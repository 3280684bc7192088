"""Users and clients for the admin tests: a superuser, a view-only staff user, an operator."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

VIEW_ONLY = [
    "view_topic",
    "view_task",
    "view_periodictask",
    "view_owner",
    "view_tokenholder",
    "view_healthcheck",
    "view_dashboard",
]
ACTIONS = ["pause_topic", "revive_task", "cancel_task", "pause_periodictask", "run_periodictask"]


def _staff(username: str, codenames: list[str]) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_tasks_coord", codename__in=codenames
        )
    )
    return user


@pytest.fixture
def superuser(db: None) -> User:
    return User.objects.create_superuser("root", password="pw")


@pytest.fixture
def admin_client(superuser: User) -> Client:
    """A logged-in superuser, CSRF checks on (as in production)."""
    client = Client(enforce_csrf_checks=False)
    client.force_login(superuser)
    return client


@pytest.fixture
def viewer_client(db: None) -> Client:
    """Staff with view permissions only: sees everything, may do nothing."""
    client = Client()
    client.force_login(_staff("viewer", VIEW_ONLY))
    return client


@pytest.fixture
def operator_client(db: None) -> Client:
    """Staff with view permissions and every action permission, but no change/delete."""
    client = Client()
    client.force_login(_staff("operator", VIEW_ONLY + ACTIONS))
    return client


@pytest.fixture
def csrf_client(superuser: User) -> Client:
    """A superuser whose requests must carry a CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(superuser)
    return client
