"""Training and inference: tau improves on demo-like prompts, determinism, best-epoch restore, bad input."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from asp.config import PredictorParams
from asp.demo.task import simulated_profile
from asp.predictor.model import LengthPredictor, encode_texts, load_backbone, pad_token_id
from asp.predictor.train import epoch_batches, predict_encoded, predict_lengths, train_predictor

# train_predictor's settings have no defaults: these are the predictor params' (tests change what they study)
SETTINGS = (
    "epochs",
    "batch_size",
    "lr",
    "weight_decay",
    "loss",
    "rank_weight",
    "patience",
    "batching",
    "lexical_weights",
)
TRAIN = {**{name: getattr(PredictorParams(), name) for name in SETTINGS}, "seed": 0}


def _fit(path: Path, n_train: int, n_val: int, **kw):
    texts, lengths, _ = simulated_profile(n_train + n_val, seed=5)
    texts = np.array(texts, dtype=object)
    bb = load_backbone(path, max_length=64, kind="auto", dtype="float32")
    model = LengthPredictor(bb, lora_r=4, lora_alpha=8, seed=0, head="linear", pooling="auto", truncation_side="right")
    tr, va = slice(0, n_train), slice(n_train, None)
    enc = encode_texts(bb.tokenizer, texts[va], 64)  # raw log-scale outputs: the untrained head may be < 0
    before = predict_encoded(model, enc, batch_size=16, pad_id=pad_token_id(bb.tokenizer))
    args = {**TRAIN, "epochs": 2, "batch_size": 8, "lr": 3e-3, "loss": "mse+pairwise", "patience": 2, "seed": 0}
    res = train_predictor(model, bb.tokenizer, texts[tr], lengths[tr], texts[va], lengths[va], **{**args, **kw})
    after = predict_lengths(model, bb.tokenizer, texts[va], batch_size=64)
    return res, before, after, lengths[va]


@pytest.mark.slow
def test_minilm_tau_improves(minilm_path: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # restored below: a changed count would leak into later tests in this process
    try:
        res, before, after, true = _fit(minilm_path, 96, 64, epochs=3, batch_size=16, lr=1e-3)
    finally:
        torch.set_num_threads(threads)
    tau_before = stats.kendalltau(before, true).statistic
    tau_after = stats.kendalltau(after, true).statistic
    # measured 0.17 -> 0.34 on 96 prompts (the demo's lengths follow its stop letter, not the prompt's length, whose
    # tau is 0.14 here; the simulated profile's own noise caps any predictor at 0.72, and the same fit on 340
    # prompts reaches 0.67)
    assert tau_after >= 0.3 and tau_after > tau_before + 0.1, (tau_before, tau_after)
    assert tau_after == pytest.approx(res.best_val_tau)  # the model holds the best epoch's weights


def test_tiny_qwen2_trains_deterministically(tiny_qwen2_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    res, _, after, true = _fit(tiny_qwen2_path, 32, 16, progress=lambda d, t: calls.append((d, t)))
    res2, _, after2, _ = _fit(tiny_qwen2_path, 32, 16)
    np.testing.assert_array_equal(after, after2)
    assert [r.val_tau for r in res.history] == [r.val_tau for r in res2.history]
    assert len(res.history) == 2 and all(math.isfinite(r.train_loss) for r in res.history)
    assert calls[-1] == (8, 8)  # 2 epochs x ceil(32 / 8) steps
    assert res.n_truncated_train == 0 and res.wall_s > 0
    assert stats.kendalltau(after, true).statistic == pytest.approx(res.best_val_tau)


def test_early_stopping_keeps_best_epoch(tiny_qwen2_path: Path) -> None:
    # a huge learning rate makes tau jump around, so patience 1 stops early; the best epoch is restored
    res, _, after, true = _fit(tiny_qwen2_path, 32, 16, epochs=6, lr=0.05, patience=1)
    taus = [r.val_tau for r in res.history]
    assert res.best_val_tau == max(t for t in taus if not math.isnan(t))
    assert res.stopped_early == (len(taus) < 6)
    assert stats.kendalltau(after, true).statistic == pytest.approx(res.best_val_tau)


def test_truncation_counted_in_training(tiny_qwen2_path: Path) -> None:
    bb = load_backbone(
        tiny_qwen2_path, max_length=32, kind="auto", dtype="float32"
    )  # the 8 training texts have 28-40 tokens: 4 are cut
    model = LengthPredictor(bb, seed=0, head="linear", pooling="auto", truncation_side="right")
    texts, lengths, _ = simulated_profile(12, seed=1)
    texts = np.array(texts, dtype=object)
    res = train_predictor(
        model, bb.tokenizer, texts[:8], lengths[:8], texts[8:], lengths[8:], **{**TRAIN, "epochs": 1, "batch_size": 4}
    )
    n_long = sum(len(bb.tokenizer(t)["input_ids"]) > 32 for t in texts[:8])
    assert res.n_truncated_train == n_long and 0 < n_long < 8


def test_bad_training_input(tiny_qwen2_path: Path) -> None:
    bb = load_backbone(tiny_qwen2_path, max_length=32, kind="auto", dtype="float32")
    model = LengthPredictor(bb, seed=0, head="linear", pooling="auto", truncation_side="right")
    t = ["add 1 + 2", "add 3", "add 4 + 5 + 6"]
    kw = {**TRAIN, "epochs": 1, "batch_size": 2}
    with pytest.raises(ValueError, match="got 2 lengths for 3 prompts"):
        train_predictor(model, bb.tokenizer, t, [1.0, 2.0], t, [1.0, 2.0, 3.0], **kw)
    with pytest.raises(ValueError, match="val_lengths: length at index 1 is nan"):
        train_predictor(model, bb.tokenizer, t, [1.0, 2.0, 3.0], t, [1.0, math.nan, 3.0], **kw)
    with pytest.raises(ValueError, match="unknown loss"):
        train_predictor(model, bb.tokenizer, t, [1.0, 2.0, 3.0], t, [1.0, 2.0, 3.0], **{**kw, "loss": "l1"})
    with pytest.raises(ValueError, match="at least 2 training and 2 validation"):
        train_predictor(model, bb.tokenizer, t[:1], [1.0], t, [1.0, 2.0, 3.0], **kw)


@pytest.mark.parametrize("batching", ["random", "length"])
def test_epoch_batches_cover_every_prompt_once(batching: str) -> None:
    lengths = np.random.default_rng(0).integers(3, 300, size=203).tolist()
    batches = epoch_batches(lengths, 8, batching, torch.Generator().manual_seed(1))
    assert sorted(i for b in batches for i in b) == list(range(203)) and len(batches) == math.ceil(203 / 8)
    again = epoch_batches(lengths, 8, batching, torch.Generator().manual_seed(1))
    assert again == batches  # the generator decides everything
    pad = sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches)
    if batching == "length":  # sorted runs of 8 batches: each batch spans a narrow band of lengths
        rand = epoch_batches(lengths, 8, "random", torch.Generator().manual_seed(1))
        pad_random = sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in rand)
        assert pad < pad_random / 3, (pad, pad_random)
    with pytest.raises(ValueError, match="batching"):
        epoch_batches(lengths, 8, "sorted", torch.Generator())


def test_lexical_blend_weight_is_picked_on_validation(tiny_qwen2_path: Path) -> None:
    res, _, after, true = _fit(tiny_qwen2_path, 32, 16, lexical_weights=(0.0, 0.5, 1.0))
    assert res.lexical_weight in (0.0, 0.5, 1.0)
    assert stats.kendalltau(after, true).statistic == pytest.approx(res.best_val_tau)  # the kept blend's tau
    net_tau = max(r.val_tau for r in res.history)  # early stopping saw the network alone
    assert res.best_val_tau >= net_tau - 1e-9  # weight 0 (the network alone) was a candidate
