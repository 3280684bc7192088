"""What the package says of itself matches what CI tests (tox.ini's environments)."""

from __future__ import annotations

import configparser
import re
import tomllib

from tests.processes import ROOT


def versions_ci_tests() -> tuple[set[str], set[str]]:
    """(Python versions, Django versions) that tox.ini's env_list tests, as "3.12", "6.1"."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    lines = tox["tox"]["env_list"].splitlines()
    envs = " ".join(line for line in lines if not line.strip().startswith("#"))
    expanded: list[str] = []
    for env in envs.split():
        # py{312,313}-dj52-sqlite: expand tox's {a,b} factors
        parts = [part.strip("{}").split(",") for part in re.split(r"(\{[^}]*\})", env) if part]
        combos = [""]
        for options in parts:
            combos = [done + option for done in combos for option in options]
        expanded += combos
    pythons = {f"3.{m}" for env in expanded for m in re.findall(r"\bpy3(\d+)\b", env)}
    djangos = {f"{a}.{b}" for env in expanded for a, b in re.findall(r"\bdj(\d)(\d)\b", env)}
    return pythons, djangos


def classifiers(prefix: str) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {c.removeprefix(prefix) for c in project["classifiers"] if c.startswith(prefix)}


def test_the_django_and_python_classifiers_are_what_ci_tests():
    pythons, djangos = versions_ci_tests()
    assert djangos, "tox.ini tests no Django version?"
    assert classifiers("Framework :: Django :: ") == djangos
    assert classifiers("Programming Language :: Python :: ") == pythons
