from django.apps import AppConfig


class FaultAppConfig(AppConfig):
    name = "benchmarks.faultapp"
    label = "faultapp"
    verbose_name = "Fault suite: workload and fenced runs"
    default_auto_field = "django.db.models.BigAutoField"
