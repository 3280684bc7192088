from django.apps import AppConfig


class ChaosAppConfig(AppConfig):
    name = "benchmarks.chaosapp"
    label = "chaosapp"
    verbose_name = "Chaos run: leader-only job runs"
    default_auto_field = "django.db.models.BigAutoField"
