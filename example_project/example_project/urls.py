from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/")),
    path("admin/", admin.site.urls),
    # The HTTP API for executors (docs/executors.md); example_project/executor.py uses it.
    path("tasks/", include("django_tasks_coord.api.urls")),
]
