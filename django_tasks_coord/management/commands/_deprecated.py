"""Old command names kept as deprecated aliases of their ``tasks_coord_`` successors."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand


def deprecated_alias(command: type[BaseCommand], old: str, new: str) -> type[BaseCommand]:
    """A subclass of ``command`` that says on stderr that ``old`` is now ``new``, then runs.

    The notice goes to stderr so scripts that read the command's output (a token, a count)
    keep working until they switch to the new name.
    """

    class Alias(command):  # type: ignore[valid-type,misc]
        help = f"Deprecated alias of {new}. {command.help}"

        def handle(self, *args: Any, **options: Any) -> Any:
            self.stderr.write(
                f"manage.py {old} is deprecated and will be removed in 1.0; use manage.py {new}."
            )
            return super().handle(*args, **options)

    Alias.__name__ = Alias.__qualname__ = "Command"
    return Alias
