"""Held-out reward (`asp.trainers.heldout`): new problems skip the excluded texts (drawing more when needed), the
paired gain and its standard error by hand, the newest trainer checkpoint's weights, and rewards of a tiny random
demo policy that follow the loaded weights (a text-dependent stand-in reward shows whose responses were scored)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asp.demo.task import generate_problems
from asp.trainers.heldout import (
    HELDOUT_SEED_OFFSET,
    MAX_DRAW_FACTOR,
    compare_heldout,
    final_weights,
    heldout_problems,
    heldout_rewards,
    paired_gain,
)


def save_tiny_demo_policy(path: Path, seed: int = 0) -> Path:
    """A random 1-layer demo-task policy (the demo tokenizer with its chat template) saved to `path`."""
    from asp.demo.policy import build_model
    from asp.demo.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        intermediate_size=32,
        max_position_embeddings=128,
        seed=seed,
    )
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def test_problems_skip_excluded_texts_and_draw_more_when_needed() -> None:
    first = generate_problems(5, seed=7 + HELDOUT_SEED_OFFSET, id_prefix="heldout")
    records, skipped = heldout_problems(5, seed=7)
    assert records == first and skipped == 0  # nothing excluded: the first draw of 5
    exclude = {first[0]["problem"], first[2]["problem"]}
    records, skipped = heldout_problems(5, seed=7, exclude=exclude)
    # 3 of the 5 candidates are left, so 10 are drawn (a new draw) and the first 5 new ones kept
    ten = generate_problems(10, seed=7 + HELDOUT_SEED_OFFSET, id_prefix="heldout")
    kept = [i for i, r in enumerate(ten) if r["problem"] not in exclude]
    assert records == [ten[i] for i in kept[:5]] and skipped == kept[4] + 1 - 5
    assert not {r["problem"] for r in records} & exclude


def test_problems_give_up_when_too_few_are_new() -> None:
    seen = set()
    m = 1
    while m <= MAX_DRAW_FACTOR:  # every candidate of every draw for n = 1
        seen |= {r["problem"] for r in generate_problems(m, seed=HELDOUT_SEED_OFFSET, id_prefix="heldout")}
        m *= 2
    with pytest.raises(ValueError, match=r"only 0 of 64 new demo problems are not among"):
        heldout_problems(1, seed=0, exclude=seen)
    with pytest.raises(ValueError, match="at least one"):
        heldout_problems(0, seed=0)


def test_paired_gain_by_hand() -> None:
    # differences 0.5, 0, 0: mean 1/6; deviations 1/3, -1/6, -1/6, so the sample std is
    # sqrt((1/9 + 1/36 + 1/36) / 2) = sqrt(1/12) and the SE sqrt(1/12) / sqrt(3) = 1/6
    gain, se = paired_gain(np.array([0.0, 0.5, 1.0]), np.array([0.5, 0.5, 1.0]))
    assert gain == pytest.approx(1 / 6) and se == pytest.approx(1 / 6)
    assert np.isnan(paired_gain(np.array([0.0]), np.array([1.0]))[1])


def test_final_weights_is_the_newest_checkpoint(tmp_path: Path) -> None:
    import torch

    from asp.trainers.weights import save_checkpoint

    assert final_weights(tmp_path) is None
    model = torch.nn.Linear(2, 2)
    for step in (10, 20):
        save_checkpoint(tmp_path / "trainer", step, model, torch.optim.AdamW(model.parameters()), {}, keep=5)
    (tmp_path / "trainer" / "step-00000030.tmp").mkdir()  # not a checkpoint's name
    assert final_weights(tmp_path) == (tmp_path / "trainer/step-00000020/model.safetensors", 20)


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny random demo policies (seeds 0 and 1): model directories."""
    root = tmp_path_factory.mktemp("heldout_policies")
    return save_tiny_demo_policy(root / "a", seed=0), save_tiny_demo_policy(root / "b", seed=1)


def test_rewards_follow_the_loaded_weights(policies: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import asp.demo.task

    monkeypatch.setattr(asp.demo.task, "reward", lambda text, answer: sum(map(ord, text)) % 7 / 7)  # the response text
    a, b = policies
    records, _ = heldout_problems(6, seed=0)
    sampling = {"samples": 2, "max_new_tokens": 12, "seed": 3, "temperature": 1.0, "device": "cpu", "num_threads": 1}
    own_a = heldout_rewards(a, None, records, **sampling)
    own_b = heldout_rewards(b, None, records, **sampling)
    a_with_b = heldout_rewards(a, b / "model.safetensors", records, **sampling)
    assert own_a.per_problem.shape == (6,) and own_a.samples == 2 and own_a.seconds > 0
    assert not np.array_equal(own_a.per_problem, own_b.per_problem)  # the two random policies answer differently
    np.testing.assert_array_equal(a_with_b.per_problem, own_b.per_problem)  # b's weights over a = b
    np.testing.assert_array_equal(heldout_rewards(a, None, records, **sampling).per_problem, own_a.per_problem)
    # any reward: a package.module:function one scores the same responses (here the demo's, by its import path)
    by_path = heldout_rewards(a, None, records, reward="asp.rl.rewards:demo_reward", **sampling)
    np.testing.assert_array_equal(by_path.per_problem, own_a.per_problem)

    out = compare_heldout(a, b / "model.safetensors", records, **sampling)
    assert out["reward_before"] == pytest.approx(own_a.mean) and out["reward_after"] == pytest.approx(own_b.mean)
    assert out["gain"] == pytest.approx(own_b.mean - own_a.mean) and out["seconds"] > 0
    with pytest.raises(FileNotFoundError, match="no such weights file"):
        heldout_rewards(a, a / "missing.safetensors", records, **sampling)
