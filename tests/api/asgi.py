"""The ASGI application the API's end-to-end tests serve with uvicorn (the test definitions loaded)."""

import django
from django.core.handlers.asgi import ASGIHandler

django.setup(set_prefix=False)

from django_tasks_coord.api.asgi import serve_long_polls  # noqa: E402
from tests.api import defs  # noqa: E402,F401  (declares the test definitions)

# Long-polls beside the middleware (no thread per waiter), as docs/executors.md recommends.
application = serve_long_polls(ASGIHandler(), "/tasks/long-poll")
