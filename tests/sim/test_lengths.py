"""Length model: sigma recovery on synthetic profiles, sampling determinism, caps, mean correction, validation, and
the later visits of a prompt (hand-worked: what persists from one visit to the next and what is drawn again).

Run: ``.venv/bin/python -m pytest tests/sim/test_lengths.py -q``.
"""

from __future__ import annotations

import numpy as np
import pytest

from asp.sim.lengths import EmpiricalLengthModel, LengthModel, fit_length_model, sample_lengths

TRUE = LengthModel(sigma_prompt=0.3, sigma_sample=0.5, bias=-0.045, max_new_tokens=1_000_000)


def synthetic_profile(model: LengthModel, prompts: int = 3000, n: int = 8, seed: int = 0):
    """(expected [P], lengths [P*n], prompt_index [P*n]) drawn from `model`."""
    rng = np.random.default_rng(seed)
    expected = rng.uniform(100, 2000, prompts)
    lengths = sample_lengths(model, expected, n, rng)
    return expected, lengths.ravel(), np.repeat(np.arange(prompts), n)


def test_fit_recovers_sigmas_and_bias():
    expected, lengths, index = synthetic_profile(TRUE)
    fitted, report = fit_length_model(expected * 1.7, expected, lengths, index, TRUE.max_new_tokens)
    assert fitted.sigma_prompt == pytest.approx(0.3, abs=0.02)
    assert fitted.sigma_sample == pytest.approx(0.5, abs=0.02)
    assert fitted.bias == pytest.approx(-0.045, abs=0.02)
    # the raw spread of log(mean of 8) includes sampling noise (exp(0.25) - 1) / 8 = 0.036 in variance
    assert report["sigma_prompt_raw"] == pytest.approx(np.sqrt(0.09 + 0.036), abs=0.02)
    assert report["prompts"] == 3000 and report["samples"] == 24_000 and report["truncated_fraction"] == 0.0
    assert report["sigma_prompt_uncalibrated"] == pytest.approx(report["sigma_prompt_raw"])  # a constant factor


def test_sampling_is_deterministic_for_a_seed():
    expected = np.array([10.0, 200.0, 3000.0])
    a = sample_lengths(TRUE, expected, 4, np.random.default_rng(7))
    b = sample_lengths(TRUE, expected, 4, np.random.default_rng(7))
    c = sample_lengths(TRUE, expected, 4, np.random.default_rng(8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.shape == (3, 4) and a.dtype == np.int32


def test_caps_respected():
    model = LengthModel(sigma_prompt=1.0, sigma_sample=1.0, bias=0.0, max_new_tokens=64)
    out = sample_lengths(model, np.array([0.01, 30.0, 1e9]), 1000, np.random.default_rng(0))
    assert out.min() == 1 and out.max() == 64
    assert (out[2] == 64).all() and (out[0] == 1).mean() > 0.99


def test_mean_of_samples_near_expected_for_calibrated_bias():
    # bias = -sigma_prompt^2 / 2 is what a calibrated predictor yields: E[L] = c * exp(bias + sp^2/2) = c
    model = LengthModel(sigma_prompt=0.4, sigma_sample=0.6, bias=-0.08, max_new_tokens=10**7)
    expected = np.full(50_000, 500.0)
    out = sample_lengths(model, expected, 8, np.random.default_rng(1))
    assert model.mean_factor() == pytest.approx(1.0)
    assert out.mean() / 500.0 == pytest.approx(1.0, abs=0.01)
    # each prompt's samples average c * exp(bias + u): the within-prompt noise has mean one
    assert np.mean(out, axis=1).mean() == pytest.approx(out.mean())


def test_fit_then_sample_reproduces_profile_mean():
    expected, lengths, index = synthetic_profile(TRUE, seed=2)
    fitted, _ = fit_length_model(expected, expected, lengths, index, TRUE.max_new_tokens)
    again = sample_lengths(fitted, expected, 8, np.random.default_rng(3))
    assert again.mean() == pytest.approx(lengths.mean(), rel=0.03)


def test_truncation_reported():
    model = LengthModel(sigma_prompt=0.2, sigma_sample=0.3, bias=0.0, max_new_tokens=120)
    expected, lengths, index = synthetic_profile(model, prompts=500)
    _, report = fit_length_model(expected, np.minimum(expected, 120.0), lengths, index, 120)
    assert report["truncated_fraction"] > 0.5


def test_round_trip_and_bad_dicts():
    assert LengthModel.from_dict(TRUE.to_dict()) == TRUE
    with pytest.raises(ValueError, match="sigma_sample"):
        LengthModel.from_dict({**TRUE.to_dict(), "sigma_sample": -0.1})
    with pytest.raises(ValueError, match="bias"):
        LengthModel.from_dict({**TRUE.to_dict(), "bias": float("nan")})
    with pytest.raises(ValueError, match="max_new_tokens"):
        LengthModel.from_dict({**TRUE.to_dict(), "max_new_tokens": 0})
    with pytest.raises(ValueError, match="unknown keys \\['mu'\\]"):
        LengthModel.from_dict({**TRUE.to_dict(), "mu": 1.0})


def test_fit_rejects_bad_inputs():
    pred, lengths, index = np.array([10.0, 20.0]), np.array([5, 6, 7, 8]), np.array([0, 0, 1, 1])
    with pytest.raises(ValueError, match="differ in shape"):
        fit_length_model(pred, pred[:1], lengths, index, 64)
    with pytest.raises(ValueError, match="calibrated_out_of_fold.*entry 1"):
        fit_length_model(pred, np.array([10.0, 0.0]), lengths, index, 64)
    with pytest.raises(ValueError, match="prompt 1 has no samples"):
        fit_length_model(pred, pred, lengths, np.array([0, 0, 0, 0]), 64)
    with pytest.raises(ValueError, match="max_new_tokens=7"):
        fit_length_model(pred, pred, lengths, index, 7)
    with pytest.raises(ValueError, match="prompt_index"):
        fit_length_model(pred, pred, lengths, np.array([0, 0, 1, 2]), 64)
    with pytest.raises(ValueError, match="2 or more samples"):
        fit_length_model(pred, pred, lengths[:2], index[1:3], 64)
    with pytest.raises(ValueError, match="n_samples"):
        sample_lengths(TRUE, pred, 0, np.random.default_rng(0))


def test_a_later_visit_keeps_the_prompt_effect_and_draws_the_samples_again():
    expected = np.array([10.0, 200.0, 3000.0])
    first = sample_lengths(TRUE, expected, 4, np.random.default_rng(7))
    v = TRUE.sample_visits(expected, 4, 3, np.random.default_rng(7), np.random.default_rng(1))
    assert v.shape == (3, 3, 4) and v.dtype == np.int32
    np.testing.assert_array_equal(v[0], first)  # visit 0 is `sample` on the same generator
    assert not np.array_equal(v[1], v[0]) and not np.array_equal(v[2], v[1])
    # no within-prompt spread: every visit is the prompt's level exp(log c + bias + u), the same each time
    flat = LengthModel(sigma_prompt=0.5, sigma_sample=0.0, bias=0.0, max_new_tokens=10**6)
    v = flat.sample_visits(expected, 4, 3, np.random.default_rng(7), np.random.default_rng(1))
    assert (v == v[0]).all() and not (v[0] == np.rint(expected)[:, None]).all()
    with pytest.raises(ValueError, match="visits must be an integer >= 1"):
        TRUE.sample_visits(expected, 4, 0, np.random.default_rng(7), np.random.default_rng(1))


def test_an_empirical_later_visit_keeps_the_row_s_level_and_takes_deviations_from_its_neighbours():
    # rows (calibrated 10, 20, 40): level 1 with no spread, level 1 with samples 0.5 / 1.5, level 2 with no spread
    ratios = np.array([[1.0, 1.0, 1.0, 1.0], [0.5, 1.5, 0.5, 1.5], [2.0, 2.0, 2.0, 2.0]])
    alone = EmpiricalLengthModel(np.array([10.0, 20.0, 40.0]), ratios, neighbors=1, max_new_tokens=1000)
    c = np.array([10.0, 20.0, 40.0])
    first = alone.sample(c, 4, np.random.default_rng(3))
    v = alone.sample_visits(c, 4, 4, np.random.default_rng(3), np.random.default_rng(5))
    np.testing.assert_array_equal(v[0], first)
    assert (v[:, 0] == 10).all()  # one neighbour, its own row: level 1, every deviation 1
    assert set(np.unique(v[1:, 1])) <= {10, 30}  # level 1 x deviations 0.5 / 1.5 of 20 tokens
    assert (v[:, 2] == 80).all()  # level 2 x deviation 1 x 40
    # two neighbours: the prompt at calibrated 10 keeps row 0's level 1 (its row at visit 0: a draw may take row 1,
    # whose level is 1 too) and takes deviations from rows 0 and 1: 0.5, 1, 1.5 of 10 tokens
    pair = EmpiricalLengthModel(np.array([10.0, 20.0, 40.0]), ratios, neighbors=2, max_new_tokens=1000)
    v = pair.sample_visits(np.full(200, 10.0), 4, 3, np.random.default_rng(3), np.random.default_rng(5))
    assert set(np.unique(v[1:])) == {5, 10, 15}
    # the level persists: a prompt next to the level-2 row, whose draw took that row, stays at twice its length
    v = pair.sample_visits(np.full(200, 40.0), 4, 2, np.random.default_rng(3), np.random.default_rng(5))
    took_level_2 = (v[0] == 80).all(axis=1)
    assert took_level_2.any() and (~took_level_2).any()
    assert set(np.unique(v[1][took_level_2])) <= {40, 80, 120} and v[1][took_level_2].mean() > 70
