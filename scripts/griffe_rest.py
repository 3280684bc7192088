"""A griffe extension for the docs build: the docstrings' reST idioms as Markdown.

The package's docstrings use Sphinx roles (``:class:`~pkg.Name```, ``:func:`f```) and
``::`` before literal blocks. mkdocstrings renders docstrings as Markdown, where both
would show up verbatim; this extension rewrites them while griffe loads the package:
a role becomes a code span of its target (``~`` keeps the last component, as Sphinx
does), and a paragraph ending in ``::`` ends in ``:`` (the indented block after it is
already a Markdown code block). Loaded by ``mkdocs.yml``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const|term|ref):`([^`]+)`")
LITERAL = re.compile(r"(?m)^(\s*)::\s*$|(?<=\S)::(?=\s*$)", re.MULTILINE)


def _role(match: re.Match[str]) -> str:
    target = match.group(1).strip()
    if "<" in target and target.endswith(">"):  # :ref:`text <target>`
        target = target.split("<", 1)[0].strip()
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def _literal(match: re.Match[str]) -> str:
    return "" if match.group(1) is not None else ":"


def rewrite(text: str) -> str:
    """``text`` with Sphinx roles as code spans and ``::`` markers as ``:``."""
    return LITERAL.sub(_literal, ROLE.sub(_role, text))


class RestToMarkdown(griffe.Extension):
    """Rewrites every docstring with :func:`rewrite` as griffe loads it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
