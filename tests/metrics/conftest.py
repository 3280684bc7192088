"""Helpers of the metrics tests: scrape the view or a node's registry, parse what comes back."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DOCS = Path(__file__).resolve().parents[2] / "docs"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: ``(name, sorted labels)`` → value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def documented() -> dict[str, tuple[str, list[str]]]:
    """The metrics of ``docs/reference/metrics.md``: name → (type, labels), from its tables.

    A table row reads ``| `name` | type | `label`, `label` | meaning |``.
    """
    rows = {}
    text = (DOCS / "reference" / "metrics.md").read_text()
    for line in text.splitlines():
        match = re.match(r"^\| `(tasks_coord_\w+)` \| (\w+) \|([^|]*)\|", line)
        if match:
            name, kind, labels = match.groups()
            rows[name] = (kind, re.findall(r"`(\w+)`", labels))
    return rows
