"""The documentation's shape: a short README that links every page of docs/, and links that
lead somewhere (a file that exists, a heading that it has). The commands on those pages run
in tests/test_readme.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, ROOT / "BENCHMARKS.md", *DOCS]

LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    prose = FENCE.sub("", page.read_text())
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", prose, re.M)}


def test_the_readme_is_short_and_links_every_page_of_docs() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"
    assert len(DOCS) >= 10
    linked = set(LINK.findall(README.read_text()))
    missing = [p.name for p in DOCS if f"docs/{p.name}" not in linked]
    assert not missing, f"pages of docs/ the README does not link: {missing}"


def test_every_relative_link_leads_to_a_file_and_a_heading_it_has() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_slug_follows_github() -> None:
    assert _slug("A tour of `jimu`") == "a-tour-of-jimu"
    assert _slug("13. `jimu plan`: predicted against measured") == (
        "13-jimu-plan-predicted-against-measured"
    )
    assert _slug("Faults and resume") == "faults-and-resume"
