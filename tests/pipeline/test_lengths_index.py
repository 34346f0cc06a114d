"""`match: contains` through `asp.io.lengths.ContainsIndex` (issue 36): the index finds exactly what the old linear
scan (`longest_contained_by_scan`: every prepared problem tried, longest first) finds, on the cases that could trip it
(problems that are prefixes, suffixes or inner parts of others, repeats, anchors that occur in the text away from
the problem, problems without spaces or shorter than an anchor, whitespace, ties), on random texts over a small
alphabet (where pieces collide all the time), and through `match_samples` with the issue-39 rule for repeated texts;
and a verl dump of 100k rollouts against 40k prompts (benchmarks/lengths_import.py's generator) imports with a
bounded number of full comparisons.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

from asp.config import LengthsFileParams
from asp.errors import UserError
from asp.io import lengths
from asp.io.lengths import ContainsIndex, longest_contained_by_scan, match_samples, parse_records

ROOT = Path(__file__).resolve().parents[2]


def _both(problems: list[str], text: str, **knobs: Any) -> str | None:
    found = ContainsIndex(problems, **knobs).longest_in(text)
    assert found == longest_contained_by_scan(problems, text), (problems, text)
    return found


@pytest.mark.parametrize(
    ("problems", "text", "expected"),
    [
        # a problem that is a prefix / a suffix / an inner part of a longer one: the longest contained wins
        (
            ["What is two plus two", "What is two plus two and then three"],
            "u: What is two plus two and then three?",
            "What is two plus two and then three",
        ),
        (
            ["What is two plus two", "What is two plus two and then three"],
            "u: What is two plus two? a:",
            "What is two plus two",
        ),
        (
            ["plus two and then three", "What is two plus two and then three"],
            "What is two plus two and then three",
            "What is two plus two and then three",
        ),
        (
            ["two plus two", "What is two plus two and then"],
            "x What is two plus two and then y",
            "What is two plus two and then",
        ),
        (["two plus two", "What is two plus two and then"], "x What is two plus one; two plus two", "two plus two"),
        # the anchor piece occurs first away from the problem (a partial copy before the real one)
        (
            ["Compute the sum of all primes below ten"],
            "Compute the sum of all primes: Compute the sum of all primes below ten",
            "Compute the sum of all primes below ten",
        ),
        (["Compute the sum of all primes below ten"], "Compute the sum of all primes below nine", None),
        # the problem glued to template text (no space before it), and repeated in the text
        (["Add mod 10: A3 B4"], "<user>Add mod 10: A3 B4</user>", "Add mod 10: A3 B4"),
        (["Add mod 10: A3 B4"], "Add mod 10: A3 B4 Add mod 10: A3 B4", "Add mod 10: A3 B4"),
        # no space at all, shorter than an anchor, longer than one
        (["Hi", "abcdefghijklmnopqrstuvwxyz"], "xxabcdefghijklmnopqrstuvwxyzxx Hi", "abcdefghijklmnopqrstuvwxyz"),
        (["Hi", "abcdefghijklmnopqrstuvwxyz"], "oh Hi there", "Hi"),
        (["a b", "ab"], "xa bx", "a b"),
        # ties: equal length, both contained: the one listed first
        (["alpha beta gamma", "gamma delta zeta"], "alpha beta gamma delta zeta", "alpha beta gamma"),
        (["gamma delta zeta", "alpha beta gamma"], "alpha beta gamma delta zeta", "gamma delta zeta"),
        # a problem equal to the text, and an empty problem (never matched)
        (["", "the whole text"], "the whole text", "the whole text"),
        (["", "nothing here"], "something else", None),
    ],
)
def test_the_index_finds_what_the_scan_finds(problems: list[str], text: str, expected: str | None) -> None:
    assert _both(problems, text) == expected
    assert _both(problems, text, q=3, candidates=2) == expected  # short anchors: more collisions and fallbacks


def test_random_texts_over_a_small_alphabet() -> None:
    """Problems cut from random texts of 'a', 'b' and spaces (pieces shared everywhere), looked up in texts that hold
    them, parts of them, and nothing: the index and the scan agree on every one, at several anchor widths."""
    rng = random.Random(7)

    def noise(n: int) -> str:
        return " ".join("".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(n)).strip()

    found = 0
    for trial in range(150):
        base = [noise(rng.randint(1, 12)) for _ in range(6)]
        problems = [" ".join(b.split()) for b in base] + [b[rng.randint(0, len(b) // 2) :].strip() for b in base]
        rng.shuffle(problems)
        for _ in range(8):
            text = " ".join(" ".join(rng.choice([noise(3), rng.choice(problems)]) for _ in range(3)).split())
            for q in (2, 3, 5, 16):
                found += _both(problems, text, q=q, candidates=1 + trial % 4) is not None
    assert found > 1000  # most texts hold a problem: the agreement is not only on None


def _frame(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    ids, problems, roles = zip(*rows, strict=True)
    return pd.DataFrame(
        {"prompt_id": ids, "problem": problems, "prompt": [f"<u>{p}</u>" for p in problems], "role": roles}
    )


def _contains(prompts: pd.DataFrame, texts: list[str]) -> pd.DataFrame:
    records = [(f"f line {i + 1}", {"prompt": t, "length": i + 1}) for i, t in enumerate(texts)]
    samples, _ = match_samples(parse_records(records, LengthsFileParams(path="f"), 8), prompts, "f", "contains")
    return samples


def test_match_samples_normalizes_whitespace_and_keeps_the_repeated_text_rules() -> None:
    """Whitespace (newlines, tabs, runs of spaces) is normalized on both sides before the index; a repeated problem
    text found inside records is dealt in turn to its prompts (issue 39); across profiled and held-out: refused."""
    prompts = _frame(
        [
            ("a", "Add mod 10:\n A3  B4", "profile"),
            ("b", "Add mod 10: A3 B4", "profile"),
            ("c", "Sum\tC1 C2", "heldout"),
        ]
    )
    texts = [
        "sys: Add mod 10: A3 B4 :end",
        "sys:\tAdd mod 10:  A3\nB4",
        "x Sum C1 C2 y",
        "sys: Add mod 10: A3 B4 :end",
    ]
    samples = _contains(prompts, texts)
    assert samples[["prompt_id", "length"]].values.tolist() == [["a", 1], ["a", 4], ["b", 2], ["c", 3]]
    shared = _frame([("a", "Add mod 10: A3", "profile"), ("b", "Add mod 10: A3", "heldout"), ("c", "U V", "heldout")])
    with pytest.raises(UserError, match="is the text of 2 prepared prompts"):
        _contains(shared, ["<s>Add mod 10: A3</s>", "U V"])


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("lengths_import", ROOT / "benchmarks" / "lengths_import.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["lengths_import"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("lengths_import", None)


def test_a_verl_dump_of_100k_rollouts_against_40k_prompts_imports(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmark's dump (lengths instead of response text, to keep the file small): every record's text is
    matched with at most a handful of full comparisons (the old scan made one per prepared problem, 40k per text),
    and the samples agree with the scan's on a subsample of the texts."""
    prompts = bench.make_prompts(40_000)
    dump = bench.make_dump(prompts, 100_000, text=False)
    path = bench.write_jsonl(tmp_path / "rollouts.jsonl", dump)
    checks = {"n": 0}
    check = lengths._contains_at_anchor

    def counted(*args: Any) -> bool:
        checks["n"] += 1
        return check(*args)

    monkeypatch.setattr(lengths, "_contains_at_anchor", counted)
    samples, times = bench.import_dump(path, prompts, 300, text=False)
    texts = {lengths._norm(r["input"]) for r in dump}
    assert len(texts) > 30_000 and checks["n"] < 10 * len(texts), (checks["n"], len(texts))
    assert sum(times.values()) < 600  # generous: seconds on a 2-core machine; the old scan took ~10 min
    assert len(samples) > 5_000 and set(samples["role"]) == {"profile", "heldout"}
    index = ContainsIndex([lengths._norm(p) for p in prompts["problem"]])
    for text in random.Random(1).sample(sorted(texts), 20):
        assert index.longest_in(text) == longest_contained_by_scan(index.problems, text)
