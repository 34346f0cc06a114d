"""The README stays a guide and every link in it and in the docs resolves (issue 36): each relative link in README.md,
CONTRIBUTING.md, CHANGELOG.md and docs/*.md names a file that exists, and a `#anchor` names a heading of that file
(GitHub's slugs). The README is at most ~250 lines and names the docs index."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # no headings inside code blocks
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto:


def test_slug_is_githubs() -> None:
    assert slug("Table 4(b): C0 vs C4 with the simulated trainer") == "table-4b-c0-vs-c4-with-the-simulated-trainer"
    assert slug("GRPO in the `launch` stage") == "grpo-in-the-launch-stage"
    assert slug("Schedule ablation (C0–C4) on held-out prompts") == "schedule-ablation-c0c4-on-held-out-prompts"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading '#{anchor}' in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_is_a_guide() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first_screen = "\n".join(text.splitlines()[:40])
    assert "make run" in first_screen and "make test" in first_screen
    for page in ("docs/README.md", "docs/benchmarks.md", "CHANGELOG.md", "CONTRIBUTING.md", "docs/gpu.md"):
        assert f"]({page}" in text, f"the README does not link {page}"


# Every results table names its command: tests/test_docs_commands.py (within a few lines, not only its section).


def test_the_docs_index_lists_every_page() -> None:
    """docs/README.md ("which page answers what") links every page in docs/."""
    index = set(links(ROOT / "docs" / "README.md"))
    pages = {p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert sorted(p for p in pages if p not in {t.partition("#")[0] for t in index}) == []
