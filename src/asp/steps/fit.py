"""Fit a predictor, written once: `asp.predictor.train.train_predictor` with its training arguments (batch size,
learning rate, weight decay, loss, rank weight, patience, batching) from the ``predictor:`` params. The
train_predictor stage trains a fresh predictor for `predictor.epochs`; re-profiling (`asp.adaptation.reprofile`)
fine-tunes the current one for `drift.reprofile_epochs`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from asp.config import PredictorParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from asp.predictor.model import LengthPredictor
    from asp.predictor.train import EpochRecord, TrainResult


def fit_predictor(
    model: LengthPredictor,
    tokenizer: PreTrainedTokenizerBase,
    train: tuple[list[str], np.ndarray],
    val: tuple[list[str], np.ndarray],
    predictor: PredictorParams,
    *,
    epochs: int,
    seed: int,
    progress: Callable[[int, int], None] | None = None,
    on_epoch: Callable[[EpochRecord], None] | None = None,
) -> TrainResult:
    """Train `model` on the (texts, mean lengths) of `train`, early stopping on `val`; at most `epochs` epochs.

    Returns `asp.predictor.train.train_predictor`'s result (history, best validation tau and epoch, ...).
    """
    from asp.predictor.train import train_predictor

    return train_predictor(
        model,
        tokenizer,
        train[0],
        train[1],
        val[0],
        val[1],
        epochs=epochs,
        batch_size=predictor.batch_size,
        lr=predictor.lr,
        weight_decay=predictor.weight_decay,
        loss=predictor.loss,
        rank_weight=predictor.rank_weight,
        patience=predictor.patience,
        batching=predictor.batching,
        lexical_weights=tuple(predictor.lexical_weights),
        seed=seed,
        progress=progress,
        on_epoch=on_epoch,
    )
