"""A workflow's graph as a picture: steps laid out by level, drawn as SVG on the server.

Like the dashboard's charts, no JavaScript and no library: :func:`layout` computes the
geometry (pure, no database), the template ``admin/django_tasks_coord/workflow_graph.html``
draws it. A step's *level* is the length of the longest chain of parents above it (the
steps without parents are level 0); each level is a column, left to right, its steps
stacked in the order they were given and centered on the tallest column, and each ``after`` dependency is an edge from the
parent's right side to the child's left side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: Geometry, in SVG user units: a step's box, the gaps between columns and rows, the margin.
BOX_WIDTH, BOX_HEIGHT = 150, 28
COLUMN_GAP, ROW_GAP, MARGIN = 50, 10, 4
#: Characters of a step's name written in its box (the whole name is in its tooltip).
LABEL_CHARS = 20
#: Steps drawn at most; a larger workflow is listed, not drawn (the picture would be
#: megabytes of SVG nobody can read).
MAX_DRAWN = 400


@dataclass
class Box:
    """One step in the picture: where, its state (the CSS class), its label and link."""

    name: str
    state: str
    level: int
    row: int
    x: int
    y: int
    label: str
    tooltip: str
    url: str = ""  #: its task's admin page; empty: no task (yet), or it was purged
    width: int = BOX_WIDTH
    height: int = BOX_HEIGHT

    @property
    def text_x(self) -> int:
        return self.x + 8

    @property
    def text_y(self) -> int:
        return self.y + self.height // 2 + 4


@dataclass
class Edge:
    """An ``after`` dependency: a cubic curve from the parent's right to the child's left."""

    parent: str
    child: str
    path: str


@dataclass
class Picture:
    """What the template draws."""

    boxes: list[Box] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    width: int = 0
    height: int = 0


@dataclass(frozen=True)
class Node:
    """The input of :func:`layout`: a step's name, parents, state, tooltip and link."""

    name: str
    after: Sequence[str]
    state: str
    tooltip: str = ""
    url: str = ""


def levels(nodes: Sequence[Node]) -> dict[str, int]:
    """Each step's level: 0 without parents, else one more than its deepest parent's.

    Parents that are not among ``nodes`` are ignored; a cycle (never stored: ``start``
    refuses one) cannot loop: a step on it gets the level reached when it is met again.
    """
    parents: Mapping[str, Sequence[str]] = {node.name: node.after for node in nodes}
    found: dict[str, int] = {}
    visiting: set[str] = set()

    def level(name: str) -> int:
        if name in found:
            return found[name]
        if name in visiting:
            return 0
        visiting.add(name)
        known = [p for p in parents.get(name, ()) if p in parents]
        value = 1 + max(level(p) for p in known) if known else 0
        visiting.discard(name)
        found[name] = value
        return value

    for node in nodes:
        level(node.name)
    return found


def layout(nodes: Sequence[Node]) -> Picture:
    """The picture of ``nodes`` (see the module): a box per step, an edge per dependency."""
    by_level = levels(nodes)
    rows: dict[int, int] = {}
    picture = Picture()
    boxes: dict[str, Box] = {}
    for node in nodes:
        level = by_level[node.name]
        row = rows.get(level, 0)
        rows[level] = row + 1
        label = node.name if len(node.name) <= LABEL_CHARS else node.name[: LABEL_CHARS - 1] + "…"
        box = Box(
            name=node.name,
            state=node.state,
            level=level,
            row=row,
            x=MARGIN + level * (BOX_WIDTH + COLUMN_GAP),
            y=MARGIN + row * (BOX_HEIGHT + ROW_GAP),
            label=label,
            tooltip=node.tooltip or node.name,
            url=node.url,
        )
        boxes[node.name] = box
        picture.boxes.append(box)
    tallest = max(rows.values(), default=0)
    for box in picture.boxes:  # each column centered on the tallest one
        box.y += (tallest - rows[box.level]) * (BOX_HEIGHT + ROW_GAP) // 2
    for node in nodes:
        child = boxes[node.name]
        for parent_name in node.after:
            parent = boxes.get(parent_name)
            if parent is None:
                continue
            x1, y1 = parent.x + BOX_WIDTH, parent.y + BOX_HEIGHT // 2
            x2, y2 = child.x, child.y + BOX_HEIGHT // 2
            middle = (x1 + x2) // 2
            path = f"M{x1},{y1} C{middle},{y1} {middle},{y2} {x2 - 4},{y2}"
            picture.edges.append(Edge(parent_name, node.name, path))
    if picture.boxes:
        picture.width = max(box.x for box in picture.boxes) + BOX_WIDTH + MARGIN
        picture.height = max(box.y for box in picture.boxes) + BOX_HEIGHT + MARGIN
    return picture
