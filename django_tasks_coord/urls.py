"""The app's URLs: the HTTP API and the metrics view, under one prefix.

Mount it where you like; the documentation assumes::

    path("tasks/", include("django_tasks_coord.urls"))

which serves the metrics at ``tasks/metrics`` (needs the ``[metrics]`` extra) and the HTTP
API under ``tasks/`` (see :mod:`django_tasks_coord.api.urls`, which you can mount alone
when you want no metrics view).
"""

from __future__ import annotations

from django.urls import include, path

from django_tasks_coord.metrics.views import metrics

urlpatterns = [
    path("metrics", metrics, name="tasks_coord_metrics"),  # before the API's catch-all
    path("", include("django_tasks_coord.api.urls")),
]
