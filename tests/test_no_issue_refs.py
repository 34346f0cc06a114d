"""The code reads as contracts: no comment or docstring in src/ cites a tracker issue ("issue 12"), which means
nothing to a reader of the code; what and why belong in the text itself, history in CHANGELOG.md."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def issue_refs(text: str) -> list[str]:
    """The tracker-issue citations in `text`."""
    return ISSUE.findall(text)


def test_the_pattern_finds_what_it_should() -> None:
    assert issue_refs("the watch (issue 12, part 1)") == ["issue 12"]
    assert issue_refs("see Issue #35 and issues 3") == ["Issue #35", "issues 3"]
    assert issue_refs("reissue 3 minibatches; an issue of the queue") == []


def test_no_source_file_cites_an_issue() -> None:
    found = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if issue_refs(line)
    ]
    assert not found, "say what the code does instead of citing an issue:\n" + "\n".join(found)
