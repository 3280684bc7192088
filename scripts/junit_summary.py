"""Add up the JUnit XML reports of every tox environment and print one closing line.

Usage: python scripts/junit_summary.py .tox/*/junit.xml
Exits 1 when a report has failures or errors, or when no report exists.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(paths: list[str]) -> int:
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    reports = [Path(p) for p in paths if Path(p).is_file()]
    for report in sorted(reports):
        suites = ET.parse(report).getroot()
        suite_list = [suites] if suites.tag == "testsuite" else list(suites)
        counts = {key: sum(int(s.get(key, 0)) for s in suite_list) for key in totals}
        print(
            f"  {report.parent.name:24} {counts['tests']:5} tests, {counts['failures']} failed, "
            f"{counts['errors']} errors, {counts['skipped']} skipped"
        )
        for key in totals:
            totals[key] += counts[key]
    failed = totals["failures"] + totals["errors"]
    passed = totals["tests"] - failed - totals["skipped"]
    print(f"total: {passed} passed, {failed} failed, {totals['skipped']} skipped")
    return 1 if failed or not reports else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
