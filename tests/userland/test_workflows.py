"""Workflows and durable steps in a user's own project (see ``conftest.py``), as documented.

- docs/workflows.md's album example, its two files taken from the document as written (the
  functions it leaves to the reader, ``make_thumbnail`` and ``save_album``, added after them),
  is started with ``publish(album)``: a fan-out of three thumbnails, then the album, which
  gets its parents' results. Then its *Follow it, or cancel it* snippet runs as written.
- A ``@task`` with durable steps (docs/howto/resume-after-a-crash.md, ``context.step``) fails
  after its first step and is retried: the retry resumes past the step.

One ``runscheduler --burst`` runs both, as it runs whole workflows (docs/workflows.md,
*Prompt*).
"""

from __future__ import annotations

import json

import pytest

from tests.userland.conftest import Project
from tests.userland.test_docs import snippets

pytestmark = pytest.mark.userland

#: What docs/workflows.md leaves to the reader: the thumbnailing and the album's saving.
USERS_OWN = """

def make_thumbnail(photo_id):
    return f"thumbs/{photo_id}.jpg"


def save_album(album_id, paths):
    return len(set(paths))  # the thumbnails the album got
"""

#: A task with durable steps whose second step fails at the first attempt.
RESUMING = """
from pathlib import Path

from django.tasks import task


@task(takes_context=True, retry={"max_attempts": 3, "retry_interval": 0})
def import_feed(context, log):
    def fetch():
        Path(log).open("a").write("fetched\\n")
        return [1, 2, 3]

    def store(rows):
        Path(log).open("a").write(f"stored at attempt {context.attempt}\\n")
        if context.attempt == 1:
            raise ConnectionError("the warehouse hung up")
        return len(rows)

    rows = context.step("fetch", fetch)
    return context.step("store", store, rows)
"""

START = """
from types import SimpleNamespace

from photos.tasks import thumbnail
from photos.views import publish
from resuming import import_feed

photos = [SimpleNamespace(pk=pk) for pk in (11, 12, 13)]
album = SimpleNamespace(pk=7, photos=SimpleNamespace(all=lambda: photos))
print(publish(album))
print(import_feed.enqueue({log!r}).id)
"""

CHECK = """
import json
from django.tasks import default_task_backend
from django_tasks_coord import workflows

status = workflows.get({workflow_id})
result = default_task_backend.get_result({result_id!r})
print(json.dumps({{
    "workflow": status.state.name,
    "steps": {{name: step.state.name for name, step in status.steps.items()}},
    "results": status.results,
    "resumed": [result.status.name, result.return_value, result.attempts],
}}))
"""


def test_the_album_workflow_and_a_resuming_task_in_a_users_project(project: Project, tmp_path):
    documented = {s.target: s.code for s in snippets("docs/workflows.md") if s.target}
    project.write("photos/__init__.py", "")
    project.write("photos/tasks.py", documented["photos/tasks.py"] + USERS_OWN)
    project.write("photos/views.py", documented["photos/views.py"])
    project.write("resuming.py", RESUMING)
    project.manage("migrate", "--noinput")
    log = tmp_path / "feed.log"
    started = project.python_code(START.format(log=str(log))).stdout.split()
    workflow_id, result_id = int(started[0]), started[1]

    node = project.manage("runscheduler", "--burst", timeout=120)
    assert "Traceback" not in node.stderr, node.stderr

    follow = next(s for s in snippets("docs/workflows.md") if "workflows.get(" in s.code)
    checked = project.python_code(
        f"from django_tasks_coord import workflows\nworkflow_id = {workflow_id}\n"
        + follow.code  # as written: the workflow ended, so its cancel returns False
        + "print(status.state.name, status.results['album'], workflows.cancel(workflow_id))\n"
        + CHECK.format(workflow_id=workflow_id, result_id=result_id)
    ).stdout.splitlines()
    assert checked[0].split() == ["SUCCEEDED", "3", "False"]
    found = json.loads(checked[1])
    thumbs = {f"thumb-{pk}" for pk in (11, 12, 13)}
    assert found["workflow"] == "SUCCEEDED", found
    assert found["steps"] == dict.fromkeys([*sorted(thumbs), "album"], "SUCCEEDED")
    assert {found["results"][name]["path"] for name in thumbs} == {
        f"thumbs/{pk}.jpg" for pk in (11, 12, 13)
    }
    assert found["results"]["album"] == 3  # the fan-in got its three parents' results
    # The retry resumed past the step the first attempt completed: fetched once.
    assert log.read_text().splitlines() == [
        "fetched",
        "stored at attempt 1",
        "stored at attempt 2",
    ]
    assert found["resumed"][:2] == ["SUCCESSFUL", 3]
