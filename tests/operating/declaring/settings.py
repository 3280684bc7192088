"""The test settings plus the apps named in ``DECLARING_APPS`` (comma-separated, of this package).

Tests run ``manage.py check`` and ``runscheduler`` in a subprocess with these settings to see
what a project with broken declarations gets: check errors, never a traceback.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [
    *INSTALLED_APPS,
    *(
        f"tests.operating.declaring.{name}"
        for name in os.environ.get("DECLARING_APPS", "").split(",")
        if name
    ),
]
