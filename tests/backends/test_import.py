"""Without Django's task framework the backend fails to import, saying what to install."""

from __future__ import annotations

import subprocess
import sys

from tests.processes import ROOT

HIDE_TASKS = """
import sys

sys.modules["django.tasks"] = sys.modules["django_tasks"] = None  # neither is importable
import django
from django.conf import settings
settings.configure(INSTALLED_APPS=["django_tasks_coord"], DATABASES={})
django.setup()
try:
    import django_tasks_coord.backends
except ImportError as exc:
    print(exc)
else:
    print("imported")
"""


def test_the_backend_needs_django_tasks_or_the_backport():
    proc = subprocess.run(
        [sys.executable, "-c", HIDE_TASKS], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert "django.tasks (Django 6.0 or later)" in message
    assert "django-tasks backport" in message
