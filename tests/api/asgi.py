"""The ASGI application the API's end-to-end tests serve with uvicorn (the test definitions loaded)."""

import django
from django.core.handlers.asgi import ASGIHandler

django.setup(set_prefix=False)

from tests.api import defs  # noqa: E402,F401  (declares the test definitions)

application = ASGIHandler()
