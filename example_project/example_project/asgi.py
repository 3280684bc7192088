"""The demo's ASGI application, served by uvicorn (``manage.py demo`` starts it).

Long-polls of the HTTP API are served beside the middleware (docs/executors.md); in DEBUG
the admin's static files are served too, as ``runserver`` would.
"""

import os

from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

django_application = get_asgi_application()

from django_tasks_coord.api.asgi import serve_long_polls  # noqa: E402

application = serve_long_polls(
    ASGIStaticFilesHandler(django_application) if settings.DEBUG else django_application,
    path="/tasks/long-poll",
)
