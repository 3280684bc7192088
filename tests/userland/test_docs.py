"""The README's and the quickstart's Python snippets, run as written in a fresh project.

Each document is followed in a ``startproject`` project of its own (``startapp myapp``, as the
quickstart's first step says), with the wheel of this checkout installed (``conftest.py``).
The snippets come out of the Markdown, so the docs cannot drift from the code:

- a snippet whose first line is ``# settings.py`` is appended to the project's settings
  (the PostgreSQL ``DATABASES`` block only where the run has PostgreSQL; its connection comes
  from the ``PG*`` variables, as the block says; on MariaDB/MySQL, where the documents show
  no block, the project's ``DATABASES`` names a database of its own on the server);
- one whose first line names another file (``# myapp/consumers.py``) becomes that file;
- any other runs, in the document's order, with ``manage.py shell -c`` after ``migrate``.

Then a node runs (``runscheduler --burst``) and the test checks what the snippets promise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import ROOT
from tests.userland.conftest import NAME, Installation, Project

pytestmark = pytest.mark.userland

FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
TARGET = re.compile(r"^# ([\w./]+\.py)\b")


@dataclass(frozen=True)
class Snippet:
    """A Python block of a Markdown document."""

    where: str
    code: str

    @property
    def target(self) -> str | None:
        """The file the snippet belongs in (its first line ``# path.py``), if it names one."""
        match = TARGET.match(self.code)
        return match.group(1) if match else None

    @property
    def postgres_only(self) -> bool:
        """The PostgreSQL settings block: applied only where the run has PostgreSQL."""
        return "django.db.backends.postgresql" in self.code


def snippets(document: str) -> list[Snippet]:
    """Every ```python block of ``document`` (relative to the checkout), in order."""
    text = (ROOT / document).read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append(Snippet(f"{document}:{line}", match.group(1)))
    return found


def follow(installation: Installation, document: str) -> tuple[Project, list[str]]:
    """A new project with every snippet of ``document`` applied; the shell snippets' output."""
    project = installation.startproject(Path(document).stem.lower())
    project.manage("startapp", "myapp")
    settings = project.path / NAME / "settings.py"
    name = f"tasks_coord_{Path(document).stem.lower()}"
    if installation.vendor == "mysql":  # the docs show no MariaDB block: the user's own
        database = installation.database(name)
        with settings.open("a") as file:
            file.write(f"\nDATABASES = {{'default': {database!r}}}\n")
    if installation.vendor == "postgresql":
        database = installation.database(name)
        project.env.update(
            PGDATABASE=str(database["NAME"]),
            PGUSER=str(database.get("USER", "")),
            PGPASSWORD=str(database.get("PASSWORD", "")),
            PGHOST=str(database.get("HOST", "")),
            PGPORT=str(database.get("PORT", "")),
        )
    outputs: list[str] = []
    migrated = False
    for snippet in snippets(document):
        target = snippet.target
        if target is not None and target.startswith("settings.py"):
            if snippet.postgres_only and installation.vendor != "postgresql":
                continue
            with settings.open("a") as file:
                file.write(f"\n# {snippet.where}\n{snippet.code}")
        elif target is not None:
            project.write(target, snippet.code)
        else:
            if not migrated:
                project.manage("migrate", "--noinput")
                migrated = True
            outputs.append(project.manage("shell", "-v", "0", "-c", snippet.code).stdout)
    if installation.vendor != "sqlite":  # the project runs on the server's database
        engine = project.python_code(
            "from django.db import connection; print(connection.vendor, connection.settings_dict['NAME'])"
        )
        assert engine.stdout.split() == [installation.vendor, str(database["NAME"])]
    return project, outputs


def test_the_documents_have_the_snippets_this_test_expects():
    readme, quickstart = snippets("README.md"), snippets("docs/quickstart.md")
    for document in (readme, quickstart):
        assert [s.target for s in document if s.postgres_only] == ["settings.py"]
    assert {s.target for s in quickstart} >= {"myapp/consumers.py", "myapp/jobs.py"}
    assert "myapp/consumers.py" in {s.target for s in readme}


def test_the_quickstart_as_written(installation: Installation):
    project, outputs = follow(installation, "docs/quickstart.md")
    assert outputs == [""]  # the push prints nothing
    node = project.manage("runscheduler", "--burst", timeout=120)
    assert "sending Welcome to alice@example.com" in node.stdout, node.stdout + node.stderr
    done = project.python_code(
        "from django_tasks_coord.models import PeriodicTask, Task\n"
        "print(sorted(Task.objects.filter(topic_id='emails').values_list('state', flat=True)))\n"
        "print(PeriodicTask.objects.filter(id='heartbeat-report').values_list('timer', flat=True)[0])\n"
    )
    # SUCCEEDED; the declared job, its timer in systemd's normalized form
    assert done.stdout.split("\n")[:2] == ["[40]", "*-*-* *:*:00/30"]


def test_the_readme_as_written(installation: Installation):
    project, outputs = follow(installation, "README.md")
    # The queue in one screen: the SUPERSEDE push replaced the first, not yet polled, task.
    assert outputs == ["sending {'amount': 12}\n"]
    node = project.manage("runscheduler", "--burst", timeout=120)
    assert "Traceback" not in node.stdout + node.stderr
