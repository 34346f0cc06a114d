"""Time-model presets: loading by name (and the params' validation), hand-worked derivations and time-model cases,
the sensitivity scaling.

Run: ``.venv/bin/python -m pytest tests/sim/test_presets.py -q``.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from asp.config import SimulateParams
from asp.sim.presets import (
    FIT,
    PAPER_PRESET,
    PRESETS,
    SENSITIVITY_GRID,
    Scale,
    get_preset,
    scaled_models,
)
from asp.sim.timemodel import FEATURES


def test_every_preset_loads_by_name_and_every_coefficient_has_a_source() -> None:
    assert {"h100-qwen2.5-1.5b", "h100-qwen2.5-7b", "h100-qwen3-8b", "h100-qwen3-30b-a3b", PAPER_PRESET} <= set(
        PRESETS
    )
    for name, preset in PRESETS.items():
        assert get_preset(name) is preset
        by_coef = {s.coefficient: s for s in preset.sources}
        for feature, coef in zip(preset.gen.feature_names, preset.gen.coef, strict=True):
            assert by_coef[feature].value == pytest.approx(coef)
        for field, value in preset.train.to_dict().items():
            if field == "step_per_sample_s" and value == 0:  # no preset has a per-sequence trainer cost
                continue
            assert by_coef[field].value == pytest.approx(value)
        for source in preset.sources:  # a non-zero coefficient names where it comes from
            if source.value > 0:
                assert source.source != "-" and source.setup != "-" and source.date != "-", (name, source)


def test_unknown_preset_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown time-model preset 'h100-70b'") as err:
        get_preset("h100-70b")
    for name in PRESETS:
        assert name in str(err.value)


def test_params_accept_fit_and_presets_and_reject_others() -> None:
    assert SimulateParams().time_model == FIT
    assert SimulateParams(time_model="h100-qwen3-8b").time_model == "h100-qwen3-8b"
    with pytest.raises(ValidationError, match="unknown time model 'a100-8b'.*h100-qwen3-8b"):
        SimulateParams(time_model="a100-8b")


def test_h100_8b_is_the_two_tpot_points() -> None:
    # TPOT(1) = 6.48 ms, TPOT(16) = 10.94 ms: per sequence (10.94 - 6.48) / 15 ms, per step 6.48 ms minus that
    gen = get_preset("h100-llama3.1-8b").gen
    per_seq = (10.94 - 6.48) / 15 / 1e3
    assert gen.coef[FEATURES["continuous"].index("generated_tokens")] == pytest.approx(per_seq)
    assert gen.coef[FEATURES["continuous"].index("decode_steps")] == pytest.approx(6.48e-3 - per_seq)
    # one sequence of 1,000 tokens: 1,000 steps at TPOT(1); 16 sequences of 1,000: 1,000 steps at TPOT(16)
    assert gen.seconds(1, 1, 1000, 1000, 100) == pytest.approx(6.48)
    assert gen.seconds(2, 8, 1000, 16_000, 200) == pytest.approx(10.94)
    # continuous batching: 8 sequences of 100 and 8 of 1,000 tokens: 1,000 steps, 8,800 sequence-steps
    assert gen.seconds(2, 8, 1000, 8800, 200) == pytest.approx(1000 * (6.48e-3 - per_seq) + 8800 * per_seq)


def test_h100_trainer_and_refresh_hand_worked() -> None:
    preset = get_preset("h100-qwen3-8b")
    # 10 x 8.19e9 FLOPs per token on 8 GPUs at 40 % of 989 TFLOPS
    per_token = 10 * 8.19e9 / (8 * 0.40 * 989e12)
    assert preset.train.step_per_token_s == pytest.approx(per_token)
    assert preset.train.step_seconds(1_000_000) == pytest.approx(1e6 * per_token)
    # the paper's T_load 73.9 s for 61.06 GB of weights, scaled to 2 x 8.19 GB
    assert preset.train.load_s == pytest.approx(73.9 * 16.38 / 61.06)
    assert preset.train.publish_seconds() == pytest.approx(23.5 * 16.38 / 61.06)
    moe = get_preset("h100-qwen3-30b-a3b")  # the trainer's FLOPs follow the 3.3 B active parameters
    assert moe.train.step_per_token_s == pytest.approx(10 * 3.3e9 / (8 * 0.40 * 989e12))


def test_paper_preset_trainer_is_amdahl_through_the_papers_two_points() -> None:
    train = get_preset(PAPER_PRESET).train
    s = (147.0 / 287.6 - 8 / 48) / (1 - 8 / 48)
    assert train.step_base_s == pytest.approx(287.6 * (s + (1 - s) * 8 / 32))
    assert train.load_s == 73.9 and train.publish_seconds() == 0.0


def test_scaled_models_multiply_the_right_costs() -> None:
    preset = get_preset("h100-qwen3-8b")
    gen, train = scaled_models(preset.gen, preset.train, Scale(step=2.0, token=0.5, train=2.0, reload=4.0))
    names = FEATURES["continuous"]
    base = dict(zip(names, preset.gen.coef, strict=True))
    new = dict(zip(names, gen.coef, strict=True))
    assert new["decode_steps"] == pytest.approx(2 * base["decode_steps"])
    assert new["generated_tokens"] == pytest.approx(0.5 * base["generated_tokens"])
    assert train.step_per_token_s == pytest.approx(2 * preset.train.step_per_token_s)
    assert train.load_s == pytest.approx(4 * preset.train.load_s)
    assert train.save_s == preset.train.save_s
    assert scaled_models(preset.gen, preset.train, Scale()) == (preset.gen, preset.train)
    assert SENSITIVITY_GRID[0] == Scale() and len(set(SENSITIVITY_GRID)) == len(SENSITIVITY_GRID)
