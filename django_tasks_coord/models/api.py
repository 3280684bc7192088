"""The HTTP API's rows: task definitions run by external executors, and bearer tokens."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _


class TaskDefinition(models.Model):
    """A task type run by executors over HTTP, as declared in code (``definitions.define``).

    Its tasks live in the topic of the same name. The rows mirror the declarations
    (:func:`django_tasks_coord.definitions.sync`), so the admin, other processes and
    the reaper see the same settings; a row whose declaration disappeared is kept with
    ``declared`` False, never deleted with its tasks' history.
    """

    name = models.CharField(_("name"), max_length=100, primary_key=True)
    description = models.TextField(_("description"), blank=True, default="")
    requested_to_start_timeout = models.FloatField(
        _("requested-to-start timeout"),
        help_text=_("Seconds a polled task may wait for its start before it is ready again."),
    )
    in_progress_timeout = models.FloatField(
        _("in-progress timeout"),
        help_text=_("Seconds without a start, notify or outcome before the attempt fails."),
    )
    allowed_retry_count = models.PositiveIntegerField(_("allowed retry count"))
    retry_delay = models.FloatField(_("retry delay"), help_text=_("Seconds before a retry."))
    concurrency_limit = models.PositiveIntegerField(
        _("concurrency limit"),
        null=True,
        blank=True,
        help_text=_("At most this many tasks requested or in progress at once; empty: no limit."),
    )
    concurrency_key_path = models.JSONField(
        _("concurrency key path"),
        null=True,
        blank=True,
        help_text=_('The limit applies per value at this path, e.g. ["params", "resourceType"].'),
    )
    params_schema = models.JSONField(_("params schema"), null=True, blank=True)
    result_schema = models.JSONField(_("result schema"), null=True, blank=True)
    error_schema = models.JSONField(_("error schema"), null=True, blank=True)
    declared = models.BooleanField(
        _("declared in code"),
        default=True,
        help_text=_("False once no code declares it any more; its tasks are kept."),
    )
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("task definition")
        verbose_name_plural = _("task definitions")
        ordering = ["name"]
        permissions = [
            ("execute_tasks", _("Can run tasks as an executor (poll, start, notify, outcome)")),
            ("submit_tasks", _("Can create and cancel tasks through the API")),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(concurrency_limit__isnull=True)
                | models.Q(concurrency_limit__gte=1),
                name="tasks_coord_definition_limit_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ApiToken(models.Model):
    """A bearer token for the HTTP API, tied to a user whose permissions it carries.

    Only a SHA-256 digest of the token is stored; the token itself is shown once,
    when it is issued (:func:`django_tasks_coord.api.auth.issue_token`, the admin or
    ``manage.py tasks_coord_createapitoken``). ``prefix`` (its first characters) tells tokens apart.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="tasks_coord_tokens",
        verbose_name=_("user"),
    )
    name = models.CharField(_("name"), max_length=100, blank=True, default="")
    prefix = models.CharField(_("prefix"), max_length=16, editable=False)
    digest = models.CharField(_("digest"), max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    last_used_at = models.DateTimeField(_("last used at"), null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(
        _("expires at"), null=True, blank=True, help_text=_("Empty: never.")
    )

    class Meta:
        verbose_name = _("API token")
        verbose_name_plural = _("API tokens")
        ordering = ["user", "name"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or self.user})"
