"""Settings of the live test server (tests/api/asgi.py): the test settings, reachable on loopback,
with the documented deployment's persistent connections (API_SERVER_CONN_MAX_AGE, 60 s unless
the test says otherwise)."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ.get("API_SERVER_CONN_MAX_AGE", "60"))
