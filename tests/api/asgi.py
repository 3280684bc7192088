"""The ASGI applications the API's end-to-end tests serve with uvicorn (the test definitions
loaded): ``application``, the documented deployment (serve_api), and
``long_polls_application``, the one before it (serve_long_polls)."""

import django
from django.core.handlers.asgi import ASGIHandler

django.setup(set_prefix=False)

from django_tasks_coord.api.asgi import serve_api, serve_long_polls  # noqa: E402
from tests.api import defs  # noqa: E402,F401  (declares the test definitions)

# The API's calls beside the middleware, in its database threads (docs/executors.md).
application = serve_api(ASGIHandler(), "/tasks/")
# Long-polls alone beside the middleware; the other calls through Django's handler.
long_polls_application = serve_long_polls(ASGIHandler(), "/tasks/long-poll")
