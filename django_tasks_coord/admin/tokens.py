"""API tokens of the HTTP executor API: issue one (shown once), see when it was last used, revoke it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_tasks_coord.api.auth import issue_token
from django_tasks_coord.models import ApiToken

if TYPE_CHECKING:
    TokenModelAdmin = admin.ModelAdmin[ApiToken]
else:
    TokenModelAdmin = admin.ModelAdmin


@admin.register(ApiToken)
class ApiTokenAdmin(TokenModelAdmin):
    """Tokens are issued through :func:`~django_tasks_coord.api.auth.issue_token` (as by
    ``manage.py tasks_coord_createapitoken``): only a digest is stored, and the token itself is shown
    once, in a message after "Save". Revoke a token by deleting it."""

    list_display = ("prefix", "name", "user", "created_at", "last_used_at", "expires_at")
    list_filter = ("expires_at",)
    search_fields = ("name", "prefix", "user__username")
    list_select_related = ("user",)
    raw_id_fields = ("user",)
    show_full_result_count = False

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> Any:
        if obj is None:
            return ["user", "name", "expires_at"]
        return ["prefix", "user", "name", "created_at", "last_used_at", "expires_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        if obj is None:
            return []
        return ["prefix", "user", "created_at", "last_used_at"]

    def save_model(
        self, request: HttpRequest, obj: ApiToken, form: ModelForm[ApiToken], change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        row, token = issue_token(obj.user, obj.name, expires_at=obj.expires_at)
        # The admin goes on with ``obj`` (log entry, redirect): make it the issued row.
        obj.pk, obj.prefix, obj.digest = row.pk, row.prefix, row.digest
        obj._state.adding, obj._state.db = False, row._state.db
        messages.warning(
            request,
            _("The new token for %(user)s is %(token)s — copy it now: it is not shown again.")
            % {"user": obj.user, "token": token},
        )
