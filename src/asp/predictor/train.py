"""Fine-tuning and batched inference of the length predictor (pure: texts and arrays in, values out).

``train_predictor`` runs AdamW over the LoRA and head parameters, evaluates Kendall's tau on the validation
prompts after every epoch, stops early when tau stops improving and leaves the model at its best epoch.
``predict_lengths`` returns predicted mean response lengths in tokens (expm1 of the model output), in
batches sorted by prompt length. No files, no tracking: the ``train_predictor`` stage does those.

Run the tests with ``.venv/bin/python -m pytest tests/predictor/test_train.py -q``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from asp.predictor.lexical import LexicalModel, fit_lexical
from asp.predictor.losses import LOSS_KINDS, combined_loss, mse_loss
from asp.predictor.metrics import kendall_tau
from asp.predictor.model import Encoded, LengthPredictor, encode_texts, pad_batch, pad_token_id

ProgressFn = Callable[[int, int], None]  # (done, total): optimizer steps in training, prompts in inference


@dataclass(slots=True)
class EpochRecord:
    """One epoch of training: mean train loss, validation loss / MSE (log1p scale) / Kendall tau, seconds."""

    epoch: int
    train_loss: float
    val_loss: float
    val_mse_log: float
    val_tau: float
    seconds: float


@dataclass(slots=True)
class TrainResult:
    """Outcome of ``train_predictor``; the model itself is left at ``best_epoch``'s weights."""

    history: list[EpochRecord] = field(default_factory=list)
    best_epoch: int = 0
    best_val_tau: float = float("nan")
    stopped_early: bool = False
    n_truncated_train: int = 0
    n_truncated_val: int = 0
    wall_s: float = 0.0
    lexical_weight: float = 0.0


def _targets(lengths: Sequence[float] | np.ndarray, name: str, n_texts: int) -> torch.Tensor:
    """Validate mean lengths (tokens) and return log1p targets as float32 [n]."""
    arr = np.asarray(lengths, dtype=np.float64)
    if arr.ndim != 1 or arr.size != n_texts:
        raise ValueError(f"{name}: got {arr.size} lengths for {n_texts} prompts; they must match one to one")
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if bad.size:
        raise ValueError(f"{name}: length at index {bad[0]} is {arr[bad[0]]}; lengths must be finite and >= 0")
    return torch.as_tensor(np.log1p(arr), dtype=torch.float32)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def predict_encoded(
    model: LengthPredictor,
    encoded: Encoded,
    *,
    batch_size: int,
    pad_id: int,
    pad_side: str = "right",
    progress: ProgressFn | None = None,
) -> np.ndarray:
    """Model outputs (log1p scale) [n] for pre-tokenized prompts, longest first so batches pad little."""
    n = len(encoded.input_ids)
    out = np.empty(n, dtype=np.float64)
    order = np.argsort([-len(s) for s in encoded.input_ids], kind="stable")
    was_training = model.training
    model.eval()
    dev = _device(model)
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            ids, mask = pad_batch([encoded.input_ids[i] for i in idx], pad_id, pad_side)
            out[idx] = model(ids.to(dev), mask.to(dev)).float().cpu().numpy()
            if progress is not None:
                progress(min(start + batch_size, n), n)
    model.train(was_training)
    return out


def predict_lengths(
    model: LengthPredictor,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    *,
    batch_size: int,
    max_length: int | None = None,
    progress: ProgressFn | None = None,
) -> np.ndarray:
    """Predicted mean response lengths in tokens [n] (float64, >= 0), in the order of ``texts``.

    Prompts longer than ``max_length`` (default: the model's) are truncated; use ``encode_texts`` and
    ``predict_encoded`` directly to also get the truncation count.
    """
    enc = model.encode(tokenizer, texts, max_length)
    logp = predict_encoded(
        model,
        enc,
        batch_size=batch_size,
        pad_id=pad_token_id(tokenizer),
        pad_side=tokenizer.padding_side,
        progress=progress,
    )
    return np.maximum(np.expm1(logp), 0.0)


def _check_args(epochs: int, batch_size: int, lr: float, loss: str, patience: int, n_train: int, n_val: int) -> None:
    if epochs < 1 or batch_size < 1 or patience < 1 or lr <= 0:
        raise ValueError(
            f"need epochs >= 1, batch_size >= 1, patience >= 1 and lr > 0; got epochs={epochs}, "
            f"batch_size={batch_size}, patience={patience}, lr={lr}"
        )
    if loss not in LOSS_KINDS:
        raise ValueError(f"unknown loss {loss!r}; choose one of {', '.join(LOSS_KINDS)}")
    if n_train < 2 or n_val < 2:
        raise ValueError(
            f"need at least 2 training and 2 validation prompts, got {n_train} and {n_val}; profile more prompts"
        )


@dataclass(slots=True)
class _Data:
    """Tokenized prompts, log1p targets [n] and padding settings of the train and validation sets."""

    train: Encoded
    y_train: torch.Tensor
    val: Encoded
    y_val: torch.Tensor
    pad_id: int
    pad_side: str


def _prepare_data(
    tokenizer: PreTrainedTokenizerBase,
    train_texts: Sequence[str],
    train_lengths: Sequence[float] | np.ndarray,
    val_texts: Sequence[str],
    val_lengths: Sequence[float] | np.ndarray,
    max_length: int,
    side: str,
) -> _Data:
    """Check the lengths, take their log1p and tokenize both sets (prompts over ``max_length`` cut on ``side``)."""
    y_train = _targets(train_lengths, "train_lengths", len(train_texts))
    y_val = _targets(val_lengths, "val_lengths", len(val_texts))
    enc_train = encode_texts(tokenizer, train_texts, max_length, side)
    enc_val = encode_texts(tokenizer, val_texts, max_length, side)
    return _Data(enc_train, y_train, enc_val, y_val, pad_token_id(tokenizer), tokenizer.padding_side)


def _step_counter(progress: ProgressFn | None, total: int) -> Callable[[], None]:
    """A callback for every optimizer step that reports (steps done, ``total``) to ``progress``."""
    done = 0

    def on_step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total), total)

    return on_step


@dataclass(frozen=True, slots=True)
class _LossSpec:
    """What every optimizer step and validation pass share: prompts per batch, how batches are drawn, the loss."""

    batch_size: int
    loss: str
    rank_weight: float
    batching: str


BATCHINGS = ("random", "length")
BUCKET_BATCHES = 8  # length batching: each run of this many batches' prompts is sorted by length, then cut


def epoch_batches(lengths: Sequence[int], batch_size: int, batching: str, gen: torch.Generator) -> list[list[int]]:
    """Prompt indices of one epoch's batches, drawn from ``gen``.

    "random": a shuffled order cut into batches. "length": the shuffled order is cut into runs of
    ``BUCKET_BATCHES`` batches, each run sorted by token length and cut into batches, and the batches shuffled:
    batches of similar lengths pad less (several times faster on real prompts of very different lengths) while
    every epoch still mixes prompts differently. Either way the epoch has ceil(n / batch_size) batches.

    Args:
        lengths: [n] token count of each training prompt.
        batch_size: prompts per batch.
        batching: "random" or "length".
        gen: the training run's torch generator.

    Returns:
        Lists of prompt indices, every index exactly once.
    """
    if batching not in BATCHINGS:
        raise ValueError(f"batching must be one of {BATCHINGS}, got {batching!r}")
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    if batching == "random":
        return [perm[i : i + batch_size] for i in range(0, len(perm), batch_size)]
    run = batch_size * BUCKET_BATCHES
    batches: list[list[int]] = []
    for start in range(0, len(perm), run):
        part = sorted(perm[start : start + run], key=lambda i: lengths[i])
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    return [batches[k] for k in torch.randperm(len(batches), generator=gen).tolist()]


def _run_epoch(
    model: LengthPredictor,
    data: _Data,
    spec: _LossSpec,
    opt: torch.optim.Optimizer,
    gen: torch.Generator,
    on_step: Callable[[], None],
) -> float:
    """One shuffled pass over the training set (order drawn from ``gen``); returns the mean batch loss."""
    model.train()
    dev = _device(model)
    n = len(data.train.input_ids)
    losses = []
    for idx in epoch_batches([len(s) for s in data.train.input_ids], spec.batch_size, spec.batching, gen):
        if len(idx) < 2 and n > 1:  # a lone leftover prompt gives no pairs; fold it into the next epoch
            continue
        ids, mask = pad_batch([data.train.input_ids[i] for i in idx], data.pad_id, data.pad_side)
        pred = model.network(ids.to(dev), mask.to(dev))
        value = combined_loss(pred, data.y_train[idx].to(dev), spec.loss, spec.rank_weight)
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), 1.0)
        opt.step()
        losses.append(float(value.detach()))
        on_step()
    return float(np.mean(losses)) if losses else float("nan")


def _validate(
    model: LengthPredictor, data: _Data, spec: _LossSpec, epoch: int, train_loss: float, started: float
) -> EpochRecord:
    """Score the validation set after ``epoch``; ``started`` is the epoch's ``time.perf_counter()`` at its start."""
    pred_val = torch.as_tensor(
        predict_encoded(
            model, data.val, batch_size=max(spec.batch_size, 32), pad_id=data.pad_id, pad_side=data.pad_side
        ),
        dtype=torch.float32,
    )
    pred_np = pred_val.numpy()
    return EpochRecord(
        epoch=epoch,
        train_loss=train_loss,
        val_loss=float(combined_loss(pred_val, data.y_val, spec.loss, spec.rank_weight)),
        val_mse_log=float(mse_loss(pred_val, data.y_val)),
        # NaN, not an error, for diverged (non-finite) predictions: early stopping then keeps the best epoch
        val_tau=kendall_tau(pred_np, data.y_val.numpy()) if np.isfinite(pred_np).all() else float("nan"),
        seconds=time.perf_counter() - started,
    )


@dataclass(slots=True)
class _BestEpoch:
    """Early-stopping state: the best validation tau so far, its epoch and a copy of its trainable weights."""

    patience: int
    tau: float = float("nan")
    epoch: int = 0
    stale: int = 0
    state: dict[str, torch.Tensor] | None = None

    def update(self, model: LengthPredictor, rec: EpochRecord) -> bool:
        """Keep the weights when ``rec`` beats the best tau; True once ``patience`` epochs passed without that."""
        if not math.isnan(rec.val_tau) and (math.isnan(self.tau) or rec.val_tau > self.tau):
            self.tau, self.epoch, self.stale = rec.val_tau, rec.epoch, 0
            self.state = {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
            return False
        self.stale += 1
        return self.stale >= self.patience

    def restore(self, model: LengthPredictor) -> None:
        """Copy the kept weights back into ``model`` (nothing kept: the model stays as it is)."""
        if self.state is None:
            return
        params = dict(model.named_parameters())
        with torch.no_grad():
            for k, v in self.state.items():
                params[k].copy_(v)


def _pick_lexical_weight(
    model: LengthPredictor, lexical: LexicalModel, data: _Data, weights: Sequence[float]
) -> tuple[float, float]:
    """Blend the trained network with the lexical ridge at the weight of largest validation tau (ties: the smaller
    weight); sets ``model.lexical`` and ``model.spec.lexical_weight`` and returns (weight, its validation tau)."""
    net = predict_encoded(model, data.val, batch_size=64, pad_id=data.pad_id, pad_side=data.pad_side)
    lex = lexical.predict(data.val.input_ids)
    y = data.y_val.numpy()
    scored = [(kendall_tau((1 - w) * net + w * lex, y), -w) for w in sorted(set(weights))]
    tau, neg_w = max((t, nw) for t, nw in scored if not math.isnan(t)) if scored else (float("nan"), 0.0)
    w = -neg_w
    model.spec = dataclasses.replace(model.spec, lexical_weight=float(w))
    model.lexical = lexical if w > 0 else None
    return float(w), float(tau)


def train_predictor(
    model: LengthPredictor,
    tokenizer: PreTrainedTokenizerBase,
    train_texts: Sequence[str],
    train_lengths: Sequence[float] | np.ndarray,
    val_texts: Sequence[str],
    val_lengths: Sequence[float] | np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    loss: str,
    rank_weight: float,
    patience: int,
    batching: str,
    lexical_weights: Sequence[float],
    max_length: int | None = None,
    seed: int,
    init_bias: bool = True,
    progress: ProgressFn | None = None,
    on_epoch: Callable[[EpochRecord], None] | None = None,
) -> TrainResult:
    """Fine-tune ``model`` in place to predict log(1 + mean length); early stopping on validation Kendall tau.

    With a positive ``lexical_weights`` candidate, a TF-IDF ridge (``asp.predictor.lexical``) is fitted on the
    training prompts first; the network trains and early-stops on its own, then the blend weight of largest
    validation tau among ``lexical_weights`` is kept (``model.spec.lexical_weight``; 0 drops the ridge).

    The training settings have no defaults here: they are the ``predictor:`` params (`asp.config.PredictorParams`
    holds the defaults; `asp.steps.fit.fit_predictor` passes them).

    Args:
        model: a fresh (or partly trained) ``LengthPredictor``.
        tokenizer: its backbone's tokenizer.
        train_texts, val_texts: prompt strings.
        train_lengths, val_lengths: measured mean response lengths in tokens, one per prompt.
        epochs: most passes over the training prompts.
        batch_size: prompts per optimizer step (ranking losses compare pairs inside a batch).
        lr, weight_decay: AdamW settings for the trainable (LoRA + head) parameters.
        loss, rank_weight: see ``asp.predictor.losses.combined_loss``.
        patience: stop after this many epochs without a better validation tau.
        batching: "random" or "length" (``epoch_batches``).
        lexical_weights: blend weights of the lexical ridge tried on the validation prompts after training.
        max_length: prompt token limit (default: the model's); longer prompts are truncated and counted.
        seed: seeds shuffling and dropout (CPU runs are deterministic for a fixed seed and thread count).
        init_bias: start the head's output at the mean training target.
        progress: called with (steps done, total steps) after every optimizer step.
        on_epoch: called with each ``EpochRecord`` as it finishes (e.g. to log curves live).

    Returns:
        ``TrainResult``; the model holds the weights of the best validation epoch.
    """
    t0 = time.perf_counter()
    _check_args(epochs, batch_size, lr, loss, patience, len(train_texts), len(val_texts))
    if batching not in BATCHINGS:
        raise ValueError(f"batching must be one of {BATCHINGS}, got {batching!r}")
    data = _prepare_data(
        tokenizer,
        train_texts,
        train_lengths,
        val_texts,
        val_lengths,
        max_length or model.spec.max_length,
        model.spec.truncation_side,
    )
    lexical = None
    if any(w > 0 for w in lexical_weights):  # the lexical ridge first, on the training prompts only
        lexical = fit_lexical(data.train.input_ids, data.y_train.numpy())
    model.lexical = None  # the network trains and early-stops alone
    model.spec = dataclasses.replace(model.spec, lexical_weight=0.0)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if init_bias:
        model.set_output_bias(float(data.y_train.mean()))
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=lr, weight_decay=weight_decay)
    result = TrainResult(n_truncated_train=data.train.n_truncated, n_truncated_val=data.val.n_truncated)
    on_step = _step_counter(progress, epochs * math.ceil(len(train_texts) / batch_size))
    spec = _LossSpec(batch_size, loss, rank_weight, batching)
    best = _BestEpoch(patience)
    for epoch in range(1, epochs + 1):
        started = time.perf_counter()
        train_loss = _run_epoch(model, data, spec, opt, gen, on_step)
        rec = _validate(model, data, spec, epoch, train_loss, started)
        result.history.append(rec)
        if on_epoch is not None:
            on_epoch(rec)
        if best.update(model, rec) and epoch < epochs:
            result.stopped_early = True
            break
    best.restore(model)
    result.best_val_tau = best.tau
    if lexical is not None:
        result.lexical_weight, result.best_val_tau = _pick_lexical_weight(model, lexical, data, lexical_weights)
    result.best_epoch = best.epoch if best.state is not None else len(result.history)
    model.eval()
    result.wall_s = time.perf_counter() - t0
    return result
