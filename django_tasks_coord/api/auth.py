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

import functools
import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.exceptions import FieldDoesNotExist
from django.db import connections
from django.db.models import BooleanField, Exists, ExpressionWrapper, F, OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone
from django.utils.functional import SimpleLazyObject

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
    user_id, _ = _token(header, ())
    return _user(user_id)


#: Django's default authentication backend: the one whose permission rules
#: :func:`authorized` can check in the token's query.
MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"
#: Stands for the digest in the compiled query (:func:`_token_query`).
_DIGEST = "?digest?"


def _permission_columns(permissions: tuple[str, ...]) -> dict[str, Any]:
    """Annotations saying whether a token's user is a superuser, holds one of
    ``permissions`` directly or through a group: what Django's ``ModelBackend`` decides."""
    wanted = Q(pk__in=[])
    for permission in permissions:
        app_label, _, codename = permission.partition(".")
        wanted |= Q(content_type__app_label=app_label, codename=codename)
    held = Permission.objects.filter(wanted)
    return {
        "_superuser": F("user__is_superuser"),
        "_direct": Exists(held.filter(user=OuterRef("user_id"))),
        "_grouped": Exists(held.filter(group__user=OuterRef("user_id"))),
    }


def _by_model_backend() -> bool:
    """Whether Django's ``ModelBackend`` alone decides permissions, on a user model that
    keeps them (``PermissionsMixin``)."""
    if list(settings.AUTHENTICATION_BACKENDS) != [MODEL_BACKEND]:
        return False
    user_model = ApiToken._meta.get_field("user").related_model
    try:
        user_model._meta.get_field("user_permissions")
        user_model._meta.get_field("groups")
    except FieldDoesNotExist:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _token_query(
    using: str, permissions: tuple[str, ...], by_model_backend: bool
) -> tuple[str, tuple[Any, ...], int]:
    """The SQL reading a token by its digest: its key, prefix and user, whether the user is
    active, whether it expired and whether its use is due to be recorded (both on the
    database's clock), and when ``ModelBackend`` decides, whether the user holds one of
    ``permissions``. Its parameters, and where the digest goes among them. Compiled once:
    building it was most of a call's own work."""
    rows = ApiToken.objects.using(using).filter(digest=_DIGEST)
    rows = rows.annotate(
        _active=F("user__is_active"),
        _expired=ExpressionWrapper(
            Q(expires_at__isnull=False, expires_at__lte=Now()), output_field=BooleanField()
        ),
        _unrecorded=ExpressionWrapper(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=db.ago(_TOUCH_EVERY)),
            output_field=BooleanField(),
        ),
    )
    if by_model_backend and permissions:
        rows = rows.annotate(**_permission_columns(permissions))
    values = rows.values_list("pk", "prefix", "user_id", *rows.query.annotations)
    sql, params = values.query.get_compiler(using).as_sql()
    return sql, tuple(params), list(params).index(_DIGEST)


def _user(user_id: int) -> Any:
    user_model = ApiToken._meta.get_field("user").related_model
    return user_model._default_manager.using(db.alias()).get(pk=user_id)


def _token(header: str | None, permissions: tuple[str, ...]) -> tuple[int, bool | None]:
    """The user id of the valid token in ``header``, and whether ``ModelBackend`` lets it do
    one of ``permissions`` (None when it does not decide, or none was asked for)."""
    if not header:
        raise AuthenticationFailed("Send an API token: 'Authorization: Bearer <token>'.")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationFailed("The Authorization header must be 'Bearer <token>'.")
    using, decides = db.alias(), bool(permissions) and _by_model_backend()
    sql, params, at = _token_query(using, permissions, decides)
    with connections[using].cursor() as cursor:
        cursor.execute(sql, (*params[:at], digest(token), *params[at + 1 :]))
        found = cursor.fetchone()
    if found is None:
        raise AuthenticationFailed("Unknown API token.")
    pk, prefix, user_id, active, expired, unrecorded, *allowed_by = found
    if expired:
        expires_at = ApiToken.objects.using(using).get(pk=pk).expires_at
        raise AuthenticationFailed(f"The API token {prefix}… expired at {expires_at}.")
    if not active:
        raise AuthenticationFailed("The API token's user is inactive.")
    if unrecorded:
        ApiToken.objects.using(using).filter(pk=pk).update(last_used_at=timezone.now())
    # ModelBackend: active superusers hold every permission, other users what they were
    # given directly or through their groups.
    return user_id, any(allowed_by) if decides else None


def authorized(header: str | None, permissions: Sequence[str]) -> tuple[Any, bool]:
    """The user of the token in ``header`` (see :func:`authenticate`), and whether it holds
    one of ``permissions`` (``"app_label.codename"``).

    With Django's default ``ModelBackend`` alone, the token, its user's state and the
    permission are read in one query, and the user is loaded when first used; with other
    backends, the user's ``has_perm`` decides.
    """
    user_id, allowed = _token(header, tuple(permissions))
    if allowed is not None:
        return SimpleLazyObject(lambda: _user(user_id)), allowed
    user = _user(user_id)
    return user, any(user.has_perm(permission) for permission in permissions)
