"""Bearer tokens for the HTTP API: issuing them, and who a request's token belongs to.

A token is ``dtc_`` followed by 43 random URL-safe characters (256 bits). Only its
SHA-256 digest is stored (:class:`~django_tasks_coord.models.ApiToken`): a stolen
database does not yield usable tokens, and since tokens are random and long a fast
digest is enough (no password hashing needed). A request authenticates with
``Authorization: Bearer <token>`` and acts as the token's user, with that user's
permissions (``django_tasks_coord.execute_tasks`` for executors,
``django_tasks_coord.submit_tasks`` to create and cancel tasks).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.models import ApiToken

PREFIX = "dtc_"
#: ``last_used_at`` is written at most this often per token (not on every request).
_TOUCH_EVERY = timedelta(minutes=1)


class AuthenticationFailed(Exception):
    """No token, an unknown or expired one, or an inactive user (HTTP 401)."""


def digest(token: str) -> str:
    """The stored form of ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


def issue_token(
    user: Any, name: str = "", *, expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """Create a token for ``user``; return the row and the token (shown this once only)."""
    token = PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.using(db.alias()).create(
        user=user,
        name=name,
        prefix=token[: len(PREFIX) + 6],
        digest=digest(token),
        expires_at=expires_at,
    )
    return row, token


def authenticate(header: str | None) -> Any:
    """The active user whose unexpired token is in the ``Authorization`` header ``header``.

    Raises :class:`AuthenticationFailed` with a message saying what is wrong.
    """
    if not header:
        raise AuthenticationFailed("Send an API token: 'Authorization: Bearer <token>'.")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationFailed("The Authorization header must be 'Bearer <token>'.")
    row = (
        ApiToken.objects.using(db.alias())
        .select_related("user")
        .filter(digest=digest(token))
        .first()
    )
    now = timezone.now()
    if row is None:
        raise AuthenticationFailed("Unknown API token.")
    if row.expires_at is not None and row.expires_at <= now:
        raise AuthenticationFailed(f"The API token {row.prefix}… expired at {row.expires_at}.")
    if not row.user.is_active:
        raise AuthenticationFailed("The API token's user is inactive.")
    if row.last_used_at is None or now - row.last_used_at > _TOUCH_EVERY:
        ApiToken.objects.using(db.alias()).filter(pk=row.pk).update(last_used_at=now)
    return row.user
