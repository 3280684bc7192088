"""The Grafana dashboard and the alert rules in docs/examples: they parse, and they use only
documented metrics, with documented labels."""

from __future__ import annotations

import json
import re

import yaml

from tests.metrics.conftest import DOCS, documented

SUFFIXES = ("_bucket", "_count", "_sum")


def metrics_in(expr: str) -> set[str]:
    found = set()
    for name in re.findall(r"\btasks_coord_\w+", expr):
        for suffix in SUFFIXES:
            if name.endswith(suffix) and name.removesuffix(suffix) in documented():
                name = name.removesuffix(suffix)
        found.add(name)
    return found


def labels_in(expr: str) -> set[str]:
    """Label names in matchers and in ``by (...)``/``on (...)`` clauses."""
    names = set(re.findall(r"(\w+)\s*(?:=|!=|=~|!~)\s*\"", expr))
    for group in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
        names.update(name.strip() for name in group.split(",") if name.strip())
    return names


def check(expr: str) -> None:
    reference = documented()
    used = metrics_in(expr)
    assert used <= set(reference), f"undocumented metric in {expr!r}"
    allowed = {"le", "instance", "job"} | {label for name in used for label in reference[name][1]}
    assert labels_in(expr) <= allowed, f"undocumented label in {expr!r}"


def test_the_alert_rules_parse_and_cover_what_the_issue_asks() -> None:
    rules = yaml.safe_load((DOCS / "examples" / "prometheus-alerts.yml").read_text())
    (group,) = rules["groups"]
    alerts = {rule["alert"]: rule for rule in group["rules"]}
    assert {
        "TasksCoordBacklogGrowing",
        "TasksCoordOldestPendingTooOld",
        "TasksCoordNoLiveNode",
        "TasksCoordNoLeader",
        "TasksCoordMissedSlots",
        "TasksCoordFailureRatio",
    } <= set(alerts)
    for rule in alerts.values():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
        assert rule["annotations"]["summary"]
        check(rule["expr"])


def test_the_dashboard_parses_and_queries_documented_metrics() -> None:
    dashboard = json.loads((DOCS / "examples" / "grafana-dashboard.json").read_text())
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    used = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            check(target["expr"])
            used |= metrics_in(target["expr"])
    assert {"tasks_coord_tasks", "tasks_coord_tasks_processed_total", "tasks_coord_leader"} <= used


def test_a_mistake_in_an_example_is_caught() -> None:
    import pytest

    with pytest.raises(AssertionError, match="undocumented metric"):
        check("rate(tasks_coord_tasks_procesed_total[5m])")
    with pytest.raises(AssertionError, match="undocumented label"):
        check('tasks_coord_nodes{topic="x"}')
