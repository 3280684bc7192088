from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The app's URLs as the docs mount them: the metrics view and the HTTP API.
    path("tasks/", include("django_tasks_coord.urls")),
]
