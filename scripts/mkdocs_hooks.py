"""MkDocs hooks of the docs build (``mkdocs.yml``): the benchmark reports as pages.

The docs link to the benchmarks' reports in the repository (``../benchmarks/results/
queue.md`` from a page in ``docs/``), which works when browsing the repository. Those
files lie outside ``docs/``, where MkDocs cannot follow, and a strict build would
count each link as broken. These hooks add every ``benchmarks/results/*.md`` to the
site (at ``benchmarks/results/``, left out of the navigation on purpose) and point
the links that leave ``docs/`` for one of them at the added page. A link that leaves
``docs/`` for anything else is still reported.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
MIRRORED = "benchmarks/results"
LINK = re.compile(r"\]\((?P<url>\.\./[^)#\s]+)(?P<anchor>#[^)\s]*)?\)")


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    """Add the benchmark reports to the site, outside the navigation."""
    for path in sorted((ROOT / MIRRORED).glob("*.md")):
        file = File(
            f"{MIRRORED}/{path.name}",
            src_dir=str(ROOT),
            dest_dir=config["site_dir"],
            use_directory_urls=config["use_directory_urls"],
            inclusion=InclusionLevel.NOT_IN_NAV,
        )
        files.append(file)
    return files


def on_page_markdown(markdown: str, page: Page, **kwargs: Any) -> str:
    """Point links that leave ``docs/`` for a benchmark report at its page in the site."""
    here = posixpath.dirname(page.file.src_uri)
    depth = len(here.split("/")) if here else 0

    def rewrite(match: re.Match[str]) -> str:
        url = match.group("url")
        in_repo = posixpath.normpath(posixpath.join("docs", here, url))  # from the repository root
        if not in_repo.startswith(MIRRORED + "/") or not (ROOT / in_repo).is_file():
            return match.group(0)
        target = "../" * depth + in_repo
        return f"]({target}{match.group('anchor') or ''})"

    return LINK.sub(rewrite, markdown)
