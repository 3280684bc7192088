"""Loading the systemd oracle data written by ``generate_systemd_data.py``."""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parent / "data"
FILES = ("calendar_curated.json", "calendar_dst.json", "calendar_random.json")


@cache
def load(name: str) -> dict[str, Any]:
    """The parsed JSON document of one data file."""
    with (DATA / name).open(encoding="utf-8") as handle:
        document: dict[str, Any] = json.load(handle)
    return document


def cases(*names: str, valid: bool | None = None) -> list[Any]:
    """pytest params (one per case) from the given files, filtered by validity."""
    params = []
    for name in names or FILES:
        label = name.removeprefix("calendar_").removesuffix(".json")
        for index, case in enumerate(load(name)["cases"]):
            if valid is None or case["valid"] is valid:
                params.append(pytest.param(case, id=f"{label}-{index}"))
    return params


def instant(text: str) -> datetime:
    """An ISO 8601 UTC instant from the data ("...Z")."""
    return datetime.fromisoformat(text)
