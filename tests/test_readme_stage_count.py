"""Every place the README and docs/ state how many stages the pipeline has ("all 9 stages", "`asp repro` of all
9", "the nine stages", "a 9-stage pipeline") agrees with dvc.yaml, so adding or removing a stage cannot leave the
text behind (issue 26 §6: the README said "all 8 stages" after `simulate` made it 9)."""

from __future__ import annotations

import re
from pathlib import Path

from asp.stage import stage_names

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
NUMBER = r"(\d+|" + "|".join(WORDS) + ")"
CLAIMS = [  # phrases that state the pipeline's stage count
    rf"\ball {NUMBER} (?:pipeline |DVC )?stages\b",
    rf"\bof all {NUMBER}\b",
    rf"\bthe {NUMBER} (?:pipeline |DVC )?stages\b",
    rf"\b{NUMBER}[- ]stage (?:pipeline|DAG)\b",
    rf"\b{NUMBER} stages (?:in|of) dvc\.yaml\b",
]


def stage_counts(text: str) -> list[tuple[str, int]]:
    """(phrase, number) for every phrase in `text` that states a stage count."""
    found = []
    for pattern in CLAIMS:
        for match in re.finditer(pattern, text, flags=re.I):
            word = match.group(1).lower()
            found.append((match.group(0), int(word) if word.isdigit() else WORDS.index(word) + 1))
    return found


def test_the_stage_count_phrases_are_found() -> None:
    text = "| all 8 stages, up to date | `asp repro` of all 8 | the nine stages | a 9-stage DAG | 6 stages changed"
    assert stage_counts(text) == [
        ("all 8 stages", 8),
        ("of all 8", 8),
        ("the nine stages", 9),
        ("9-stage DAG", 9),
    ]


def test_readme_and_docs_state_dvc_yamls_stage_count() -> None:
    n = len(stage_names(ROOT / "dvc.yaml"))
    wrong = [
        f"{path.relative_to(ROOT)}: '{phrase}'"
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for phrase, count in stage_counts(path.read_text())
        if count != n
    ]
    assert not wrong, f"dvc.yaml has {n} stages, but the text says otherwise: {wrong}"
