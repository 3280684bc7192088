"""``manage.py tasks_coord_createapitoken USERNAME``: issue a bearer token for the HTTP API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from django_tasks_coord.api.auth import issue_token
from django_tasks_coord.management.commands._arguments import non_negative_float


class Command(BaseCommand):
    help = (
        "Issue an API token for a user and print it (only its digest is stored: it cannot be "
        "shown again). The token carries the user's permissions: "
        "django_tasks_coord.execute_tasks for executors, django_tasks_coord.submit_tasks to "
        "create and cancel tasks."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="The user the token acts as.")
        parser.add_argument(
            "--name", default="", help="What the token is for (shown in the admin)."
        )
        parser.add_argument(
            "--expires-in", type=non_negative_float, metavar="DAYS", help="Expire after DAYS days."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        model = get_user_model()
        try:
            user = model._default_manager.get_by_natural_key(options["username"])
        except model.DoesNotExist:
            raise CommandError(f"No user is named {options['username']!r}.") from None
        expires_at = None
        if options["expires_in"] is not None:
            expires_at = timezone.now() + timedelta(days=options["expires_in"])
        _, token = issue_token(user, options["name"], expires_at=expires_at)
        self.stdout.write(token)
