"""Benchmarks of django-tasks-coord, each a module run from the repository root.

    python -m benchmarks.throughput --databases postgres --tasks 5000
    ./run bench throughput            # the same, in the project's virtualenv

What they share: ``common`` (database servers, Django set-up, metadata, reports),
``settings`` (the one settings module of every subprocess, driven by the environment) and
``cluster`` (``runscheduler`` nodes started, watched and stopped together). Nothing here
imports Django or the package at import time: the peers' virtualenv, where the package is
not installed, imports ``benchmarks.settings`` too.
"""
