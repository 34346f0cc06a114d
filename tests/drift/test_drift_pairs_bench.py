"""benchmarks/drift_pairs.py on two real pairs, without running the whole benchmark (182 pairs, minutes): the true
change it measures (load ratio against the evaluate stage's reference, tau drop) and how it classifies a pair, the
delays it reads off the detector, and its summary table."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("drift_pairs", ROOT / "benchmarks" / "drift_pairs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["drift_pairs"] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("drift_pairs", None)


def test_the_tuning_pair_is_beyond_the_bands_and_caught_in_three_windows(bench: ModuleType) -> None:
    """phi-2-sft -> phi-2-dpo: answers ~60 % longer against the reference (the data README: mean 176 -> 271 words),
    the ranking about the same; caught in the minimum 3 windows on every stream, never before the change."""
    found = bench.streams("phi-2-sft", "phi-2-dpo", splits=2, seeds=1, change_at=10, after=10)
    assert [(s.split, s.seed) for s in found] == [(0, 0), (1, 0)]
    for s in found:
        assert 1.4 < s.load_ratio < 1.8 and abs(s.tau_drop) < 0.1 and s.beyond and s.widened
        assert s.delay == 3 and not s.early


def test_a_pair_of_like_lengths_is_within_the_tolerance(bench: ModuleType) -> None:
    """Qwen1.5-7B-Chat -> Qwen1.5-14B-Chat: the same family at about the same length (mean 255 / 253 words) and
    order (the sibling tau 0.71): within the tolerance, and the summary counts it in its last row."""
    (s,) = bench.streams("Qwen1.5-7B-Chat", "Qwen1.5-14B-Chat", splits=1, seeds=1, change_at=10, after=5)
    assert 0.9 < s.load_ratio < 1.1 and s.tau_drop < 0.1 and not s.beyond and not s.widened
    rows = bench.summary([s], 5)
    assert rows[0].startswith("| A -> B streams, by the true change on their split | pairs | streams | fired within 5")
    assert rows[-1].startswith("| within the tolerance") and "| 1 | 1 |" in rows[-1], rows
    assert all("| 0 | 0 | 0 (0 %) | – | 0 |" in row for row in rows[2:-1]), rows
