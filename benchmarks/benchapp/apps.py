from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "benchmarks.benchapp"
    label = "benchapp"
    verbose_name = "Benchmark no-op consumers"
