"""Settings of the live test server (tests/api/asgi.py): the test settings, reachable on loopback."""

from tests.settings import *  # noqa: F403

ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
