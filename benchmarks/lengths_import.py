"""Importing a verl rollout dump (`profile.source: file`, `match: contains`): the indexed match against the old linear
scan (issue 36).

    .venv/bin/python benchmarks/lengths_import.py                        # 100k rollouts vs 40k prompts (~1 min)
    .venv/bin/python benchmarks/lengths_import.py --rollouts 10000 --prompts 4000 --side-by-side 2000

Everything is synthetic and generated locally (seeded): 40k prepared math-style problems (a word-problem template
with numbers, names and objects; a third start with one of three shared instruction lines; 1 % repeat another
problem's text under their own id, in the same role), prepared as prepare writes them (prompt_id, problem, the
chat-templated prompt, role: 2,000 profiled, 500 held out, the rest train only), and a verl
`trainer.rollout_data_dir` dump of 100k rollouts, one JSONL line each (input: the problem in a chat template with the
special tokens removed, as verl writes it; output: response text; score; step), 5 % of them answering prompts
prepare did not keep. The import is the profile stage's own code (`asp.io.lengths`: read_rollouts, parse_records,
match_samples), timed per phase. Response text is counted by whitespace words, a stand-in for the policy's
tokenizer, whose cost is the user's tokenizer's and not what is measured here.

The old path is `longest_contained_by_scan` (every prepared problem tried for every record text, longest first, as
`match_samples` did before the index): at the full size it is timed on a random subsample of the distinct record
texts and extrapolated to all of them (`--scan-sample`); `--side-by-side N` also runs the whole import both ways on
the first N prompts (and their rollouts) and checks that the samples come out equal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from asp.config import LengthsFileParams  # noqa: E402
from asp.io import lengths  # noqa: E402

NAMES = ["Alice", "Bob", "Carmen", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kofi", "Lena"]
THINGS = ["apples", "marbles", "books", "coins", "pencils", "stickers", "tickets", "cookies", "stamps", "shells"]
VERBS = ["buys", "gives away", "finds", "loses", "sells", "collects", "receives", "trades"]
INSTRUCTIONS = [
    "Solve the following math problem step by step. The last line of your response should be the answer.",
    "Answer the question below. Think carefully and show your reasoning.",
    "You are given a grade-school word problem.",
]
WHEN = ["on Monday", "at the market", "from a friend", ""]
SYSTEM = "system\nYou are a helpful assistant.\nuser\n"
SUFFIX = "\nLet's think step by step and output the final answer within \\boxed{}.\nassistant\n"
WORDS = ["so", "the", "total", "is", "then", "we", "add", "and", "subtract", "each", "gives", "us", "left", "over"]


def problem(rng: random.Random) -> str:
    """A word problem of 2-8 sentences (about 100-600 characters)."""
    who, other = rng.sample(NAMES, 2)
    sentences = [f"{who} has {rng.randint(2, 999)} {rng.choice(THINGS)}."]
    for _ in range(rng.randint(1, 6)):
        sentences.append(
            f"{rng.choice([who, other, 'Then ' + who, 'Later ' + other])} {rng.choice(VERBS)} "
            f"{rng.randint(1, 500)} {rng.choice(THINGS)} {rng.choice(WHEN)}."
        )
    sentences.append(f"How many {rng.choice(THINGS)} does {rng.choice([who, other])} have now?")
    text = " ".join(sentences).replace(" .", ".")
    return f"{rng.choice(INSTRUCTIONS)} {text}" if rng.random() < 1 / 3 else text


def make_prompts(n: int, seed: int = 0, profile: int = 2000, heldout: int = 500) -> pd.DataFrame:
    """Prepared prompts as `asp.pipeline.profile_import.prepared_prompts` returns them (roles in that order)."""
    rng = random.Random(seed)
    profile, heldout = min(profile, n // 3), min(heldout, n // 3)
    roles = ["profile"] * profile + ["heldout"] * heldout + ["train"] * (n - profile - heldout)
    problems: list[str] = []
    by_role: dict[str, list[str]] = {}
    for role in roles:  # a repeat copies a text of its own role (issue 39: never across profiled and held out)
        same = by_role.setdefault(role, [])
        problems.append(rng.choice(same) if len(same) > 10 and rng.random() < 0.01 else problem(rng))
        same.append(problems[-1])
    return pd.DataFrame(
        {
            "prompt_id": [f"p{i:06d}" for i in range(n)],
            "problem": problems,
            "prompt": [f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n" for p in problems],
            "role": roles,
        }
    )


def make_dump(prompts: pd.DataFrame, n: int, seed: int = 0, text: bool = True) -> list[dict[str, Any]]:
    """n verl rollout records (input, output, score, step); `text=False`: a `length` field instead of output."""
    rng = random.Random(seed + 1)
    problems = prompts["problem"].tolist()
    out = []
    for i in range(n):
        p = rng.choice(problems) if rng.random() > 0.05 else problem(rng)  # 5 %: a prompt prepare did not keep
        words = rng.randint(3, 300)
        rec: dict[str, Any] = {"input": f"{SYSTEM}{p}{SUFFIX}", "score": float(rng.random() < 0.5), "step": i // 1024}
        if text:
            rec["output"] = " ".join(rng.choice(WORDS) for _ in range(words))
        else:
            rec["length"] = words
        out.append(rec)
    return out


def spec(path: Path, text: bool = True) -> LengthsFileParams:
    if text:
        return LengthsFileParams(
            path=str(path), prompt_field="input", length_field=None, response_field="output", step_field="step",
            match="contains",
        )  # fmt: skip
    return LengthsFileParams(path=str(path), prompt_field="input", length_field="length", match="contains")


def count_words(texts: list[str]) -> list[int]:
    return [len(t.split()) for t in texts]


class LinearScan:
    """The old `contains` path (before the index), in `ContainsIndex`'s place: every problem tried per text."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems

    def longest_in(self, text: str) -> str | None:
        return lengths.longest_contained_by_scan(self.problems, text)


def import_dump(
    path: Path, prompts: pd.DataFrame, cap: int, text: bool = True
) -> tuple[pd.DataFrame, dict[str, float]]:
    """The profile stage's import of `path`, timed per phase (seconds)."""
    times: dict[str, float] = {}
    t = time.perf_counter()
    records = lengths.read_rollouts(path)
    times["read"] = time.perf_counter() - t
    t = time.perf_counter()
    responses = lengths.parse_records(records, spec(path, text), cap, count_words)
    times["parse"] = time.perf_counter() - t
    t = time.perf_counter()
    samples, _ = lengths.match_samples(responses, prompts, str(path), "contains")
    times["match"] = time.perf_counter() - t
    return samples, times


def with_scan(fn: Any, *args: Any) -> Any:
    """`fn(*args)` with the old linear scan in the index's place."""
    index = lengths.ContainsIndex
    lengths.ContainsIndex = LinearScan  # type: ignore[misc,assignment]
    try:
        return fn(*args)
    finally:
        lengths.ContainsIndex = index  # type: ignore[misc]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=40_000)
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--scan-sample", type=int, default=200, help="distinct texts the old scan is timed on")
    parser.add_argument("--side-by-side", type=int, default=2_000, help="prompts of the both-ways import (0: none)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    prompts = make_prompts(args.prompts)
    cap = 300
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dump = make_dump(prompts, args.rollouts)
        path = write_jsonl(Path(tmp) / "rollouts.jsonl", dump)
        mb = path.stat().st_size / 2**20
        t = time.perf_counter()
        index = lengths.ContainsIndex([lengths._norm(p) for p in prompts["problem"]])
        build = time.perf_counter() - t
        samples, times = import_dump(path, prompts, cap)
        total = sum(times.values())
        texts = list(dict.fromkeys(lengths._norm(r["input"]) for r in dump))
        sample = random.Random(0).sample(texts, min(args.scan_sample, len(texts)))
        scan = LinearScan(index.problems)
        t = time.perf_counter()
        for text in sample:
            scan.longest_in(text)
        per_text = (time.perf_counter() - t) / len(sample)
        same = all(index.longest_in(text) == scan.longest_in(text) for text in sample[:50])
        scan_match = per_text * len(texts)
        rows.append(
            (
                f"{args.rollouts:,} rollouts ({mb:.0f} MB JSONL, {len(texts):,} distinct prompt texts) vs "
                f"{len(prompts):,} prompts",
                f"{times['read']:.1f} / {times['parse']:.1f} / {times['match']:.1f} (index built in {build:.2f})",
                f"{total:.1f}",
                f"{times['read'] + times['parse'] + scan_match:,.0f} (match {scan_match:,.0f}: "
                f"{1000 * per_text:.0f} ms x {len(texts):,} texts, timed on {len(sample)})",
                f"{len(samples):,} samples; index = scan on 50 texts: {same}",
            )
        )
        if args.side_by_side:
            n = args.side_by_side  # a fifth profiled, a twentieth held out, the rest train only
            role = prompts.groupby("role", sort=False)
            small = pd.concat([role.get_group(r).head(k) for r, k in (("profile", n // 5), ("heldout", n // 20))])
            small = pd.concat([small, role.get_group("train").head(n - len(small))], ignore_index=True)
            keep = set(small["problem"])
            sub = [r for r in dump if r["input"][len(SYSTEM) : -len(SUFFIX)] in keep]
            sub_path = write_jsonl(Path(tmp) / "small.jsonl", sub)
            a, ta = import_dump(sub_path, small, cap)
            b, tb = with_scan(import_dump, sub_path, small, cap)
            rows.append(
                (
                    f"{len(sub):,} rollouts vs {len(small):,} prompts, both ways",
                    f"{ta['read']:.1f} / {ta['parse']:.1f} / {ta['match']:.2f}",
                    f"{sum(ta.values()):.1f}",
                    f"{sum(tb.values()):.1f} (match {tb['match']:.1f}, measured)",
                    f"{len(a):,} samples, equal: {a.equals(b)}",
                )
            )
    print(f"load average at the start {load:.1f}\n")
    print("| dump | indexed: read / parse / match (s) | indexed total (s) | old linear scan total (s) | check |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
