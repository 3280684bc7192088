"""``@task`` functions the workflow tests run (module level, as Django requires).

Every run is recorded as a ``tests.testapp.models.Run`` (topic ``workflow``, identifier:
the label), so a test can count how many times a step ran.
"""

from __future__ import annotations

import os
import time

from django.utils import timezone

from django_tasks_coord.backends.compat import task
from tests.testapp.models import Run


def _record(label: str) -> None:
    Run.objects.create(
        topic="workflow",
        identifier=label,
        sequence=0,
        attempt=1,
        started_at=timezone.now(),
        pid=os.getpid(),
    )


@task()
def thumbnail(photo: int) -> dict[str, int]:
    """A thumbnail of ``photo``: its number and a size."""
    _record(f"thumbnail-{photo}")
    return {"photo": photo, "size": photo * 10}


@task()
def album(results: dict[str, dict[str, int]]) -> dict[str, int]:
    """The album of the thumbnails in ``results``: how many, and their sizes' sum."""
    _record("album")
    return {"count": len(results), "total": sum(value["size"] for value in results.values())}


@task()
def step(label: str) -> str:
    """A step that records ``label`` and returns it."""
    _record(label)
    return label


@task(max_attempts=1)
def fail(message: str) -> None:
    """A step that fails."""
    _record("fail")
    raise ValueError(message)


@task()
def gather(results: dict[str, object], label: str = "gather") -> dict[str, object]:
    """A fan-in that returns what it got."""
    _record(label)
    return results


@task(takes_context=True)
def until_canceled(context) -> None:
    """Run until a cancel is requested (at most 30 s), checking for it every 20 ms."""
    _record("until_canceled")
    for _ in range(1500):
        context.raise_if_canceled()
        time.sleep(0.02)  # simulated work between two checkpoints
