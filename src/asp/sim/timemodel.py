"""Time models of the simulator: seconds to decode one minibatch and seconds of one trainer step (pure, no I/O).

`GenerationTimeModel` predicts a minibatch's wall time from what the simulator knows about it (prompts, samples
per prompt, the longest and the summed response length, the prompt tokens) as a linear model with non-negative
coefficients over physically motivated features. Two forms, one per batching discipline (S = decode steps =
the longest response, R = prompts * n rows, p = mean prompt length in tokens):

* ``static`` (Hugging Face ``generate``: one padded batch; every row runs until the longest response ends):
  ``intercept`` (per-call overhead: tokenisation, setup, detokenisation), ``decode_steps`` = S (per-step cost
  that does not grow with the batch: Python loop, kernel launches, reading the weights once per step),
  ``row_steps`` = R * S (per-row work of every step, padding rows included: matmuls, sampling),
  ``prefill_tokens`` = n * prompt_tokens (each prompt is repeated n times, so prefill covers R rows), and
  ``kv_reads`` = R * S * (p + S / 2) (KV-cache positions attended during decode: row r reads p + t positions
  at step t; summed over S steps that is S * p + S^2 / 2 per row).
* ``continuous`` (vLLM: finished sequences leave the batch; the longest response still sets the number of
  steps): ``intercept``, ``decode_steps`` = S, ``generated_tokens`` = total_tokens (the sum over steps of the
  active sequences, i.e. per-sequence per-step work), ``prefill_tokens`` = prompt_tokens (the n samples of a
  prompt fork after one prefill), and ``kv_reads`` = T * (p + T / (2R)) (the mean-field value of sum_j
  len_j * (p + len_j / 2): it is exact when all lengths are equal and low by R * var(len) / 2 otherwise).

`fit_generation_model` fits either form on the profile stage's timings (``metrics/profile_timings.csv``) by
non-negative least squares on RMS-scaled columns with a tiny ridge (1e-6 of the data's scale). The ridge only
breaks ties: when columns are collinear (a profile with one minibatch size makes ``row_steps`` proportional to
``decode_steps``) it splits the weight evenly between them instead of picking one arbitrarily, so a model
fitted on 16-prompt minibatches scales part of the time with the rows at 18 prompts. Quality is measured out
of sample: K-fold cross-validation (every minibatch predicted by a fit on the other folds) gives R^2 and the
median absolute percentage error.

`TrainingTimeModel` is the trainer side: step time = base + per_sample * sequences (prompts x samples) +
per_token * response tokens of the global batch, plus the weight refresh of the paper's deferred reload (T_save +
T_convert once per exported snapshot on the trainer, T_load per actor before its next minibatch).
`fit_training_model` fits it on one or more GRPO launches' ``outputs/launch/iterations.parquet``; the per-sample
term is fitted only when the launches differ in batch size (one batch size cannot tell it from the base).

How a launch's engines and trainer share CPU cores, and the full-speed training times under it, are fitted by
`asp.sim.sharing.fit_cpu_sharing` (`shared` applies its generation factor to a model fitted here).

Run the tests with ``.venv/bin/python -m pytest tests/sim/test_timemodel.py -q``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:  # pandas and scipy are imported where the fits run: `asp.config` imports the presets' models
    import pandas as pd

FLOOR_S = 1e-6  # smallest time any model returns (s): events never take zero or negative time
RIDGE = 1e-6  # tie-breaking ridge, relative to the RMS-scaled normal equations
FEATURES: dict[str, tuple[str, ...]] = {
    "static": ("intercept", "decode_steps", "row_steps", "prefill_tokens", "kv_reads"),
    "continuous": ("intercept", "decode_steps", "generated_tokens", "prefill_tokens", "kv_reads"),
}
TIMING_COLUMNS = ("wall_s", "num_prompts", "n", "max_length", "total_tokens", "prompt_tokens")
TRAIN_TIME_COL, TRAIN_TOKENS_COL, TRAIN_PROMPTS_COL = "train/t_train_s", "train/response_tokens", "train/prompts"
REFRESH_COLS = {"save_s": "train/t_save_s", "convert_s": "train/t_convert_s", "load_s": "train/t_load_s"}
T_TRAIN_WINDOW = 10  # GRPO's LagMonitor reports t_train as the mean of the last 10 steps (trainers/grpo.py)
DRIFT_PARTS = 5  # speed_drift: consecutive parts of the profile's timed minibatches
DRIFT_WARN = 0.15  # a profile whose speed moved more than this is worth timing again on an idle machine


def _check_nonneg(name: str, value: Any) -> float:
    """`value` as a float, or ValueError naming `name` when it is not a finite number >= 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return v


def _checked_keys(cls: type, data: Any) -> dict[str, Any]:
    """`data` if it is a dict with exactly the dataclass `cls`'s field names; ValueError naming the bad keys."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}.from_dict needs a dict, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown, missing = sorted(set(data) - names), sorted(names - set(data))
    if unknown or missing:
        raise ValueError(f"{cls.__name__}.from_dict: unknown keys {unknown}, missing keys {missing}")
    return data


def generation_features(
    form: str,
    prompts: np.ndarray,
    n_samples: np.ndarray,
    max_length: np.ndarray,
    total_tokens: np.ndarray,
    prompt_tokens: np.ndarray,
) -> np.ndarray:
    """Feature matrix of `form` (see the module docstring); arguments broadcast against each other.

    Args:
        form: ``static`` or ``continuous``.
        prompts: prompts per minibatch; n_samples: samples per prompt.
        max_length: longest response (tokens) = decode steps; total_tokens: generated tokens summed over samples.
        prompt_tokens: prompt tokens summed over the minibatch's prompts.

    Returns:
        float64 [m, 5] features in the order of ``FEATURES[form]`` (m = broadcast size).
    """
    p, n, s, t, pt = np.broadcast_arrays(
        *(np.asarray(a, dtype=np.float64) for a in (prompts, n_samples, max_length, total_tokens, prompt_tokens))
    )
    p, n, s, t, pt = (a.ravel() for a in (p, n, s, t, pt))
    rows = np.maximum(p * n, 1.0)
    mean_prompt = pt / np.maximum(p, 1.0)
    if form == "static":
        cols = (np.ones_like(s), s, rows * s, n * pt, rows * s * (mean_prompt + s / 2))
    elif form == "continuous":
        cols = (np.ones_like(s), s, t, pt, t * (mean_prompt + t / (2 * rows)))
    else:
        raise ValueError(f"form must be one of {sorted(FEATURES)}, got {form!r}")
    return np.column_stack(cols)


@dataclass(frozen=True)
class GenerationTimeModel:
    """Seconds to decode one minibatch: ``max(coef . features, FLOOR_S)``.

    Attributes:
        form: ``static`` (padded batch, HF) or ``continuous`` (continuous batching, vLLM).
        coef: non-negative coefficients, one per feature (seconds per unit of the feature).
        feature_names: ``FEATURES[form]`` (stored so a saved model says what its coefficients multiply).
    """

    form: Literal["static", "continuous"]
    coef: tuple[float, ...]
    feature_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.form not in FEATURES:
            raise ValueError(f"form must be one of {sorted(FEATURES)}, got {self.form!r}")
        names = tuple(self.feature_names)
        if names != FEATURES[self.form]:
            raise ValueError(f"feature_names of form {self.form!r} must be {FEATURES[self.form]}, got {names}")
        if isinstance(self.coef, str | bytes) or len(self.coef) != len(names):
            raise ValueError(f"coef needs {len(names)} values (one per feature {names}), got {self.coef!r}")
        coef = tuple(_check_nonneg(f"coef[{name}]", c) for name, c in zip(names, self.coef, strict=True))
        object.__setattr__(self, "coef", coef)
        object.__setattr__(self, "feature_names", names)

    def seconds_many(self, prompts, n_samples, max_length, total_tokens, prompt_tokens) -> np.ndarray:
        """Vectorised `seconds`: array arguments (broadcast together) -> float64 [m] seconds."""
        x = generation_features(self.form, prompts, n_samples, max_length, total_tokens, prompt_tokens)
        return np.maximum(x @ np.asarray(self.coef), FLOOR_S)

    def seconds(self, prompts: int, n_samples: int, max_length: int, total_tokens: int, prompt_tokens: int) -> float:
        """Wall seconds of one minibatch (prompts, samples per prompt, longest / total response and prompt tokens)."""
        return float(self.seconds_many(prompts, n_samples, max_length, total_tokens, prompt_tokens)[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{"form": ..., "coef": [...], "feature_names": [...]}``."""
        return {"form": self.form, "coef": list(self.coef), "feature_names": list(self.feature_names)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationTimeModel:
        """Inverse of `to_dict`; raises ValueError naming the bad key or value."""
        d = _checked_keys(cls, data)
        if d["form"] not in FEATURES:
            raise ValueError(f"form must be one of {sorted(FEATURES)}, got {d['form']!r}")
        for key in ("coef", "feature_names"):
            if not isinstance(d[key], list | tuple):
                raise ValueError(f"{key} must be a list, got {d[key]!r}")
        return cls(form=d["form"], coef=tuple(d["coef"]), feature_names=tuple(d["feature_names"]))


def nnls_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares of y on x with RMS-scaled columns and a tiny tie-breaking ridge.

    Args:
        x: [m, k] features; y: [m] targets.

    Returns:
        float64 [k] coefficients >= 0 in the units of the unscaled columns.
    """
    scale = np.sqrt(np.mean(x**2, axis=0))
    scale[scale == 0] = 1.0
    k = x.shape[1]
    a = np.vstack([x / scale, math.sqrt(RIDGE * len(y)) * np.eye(k)])
    from scipy.optimize import nnls

    coef, _ = nnls(a, np.concatenate([y, np.zeros(k)]))
    return coef / scale


def r2_score(y: np.ndarray, pred: np.ndarray) -> float:
    """Coefficient of determination 1 - SSE / SST (NaN when y is constant)."""
    sst = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - pred) ** 2)) / sst if sst > 0 else float("nan")


def _check_timings(frame: pd.DataFrame, form: str, folds: int) -> None:
    if form not in FEATURES:
        raise ValueError(f"form must be one of {sorted(FEATURES)}, got {form!r}")
    missing = [c for c in TIMING_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"timings frame lacks columns {missing} (needs {list(TIMING_COLUMNS)})")
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    need = max(folds, len(FEATURES[form]) + 2)
    if len(frame) < need:
        raise ValueError(f"need at least {need} timed minibatches to fit and cross-validate, got {len(frame)}")
    values = frame[list(TIMING_COLUMNS)].to_numpy(dtype=np.float64)
    bad = ~np.all(np.isfinite(values), axis=1) | (values[:, 0] <= 0) | np.any(values[:, 1:] < 0, axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"timings row {row} has a non-positive or non-finite wall_s or a negative/non-finite count: "
            f"{frame.iloc[row][list(TIMING_COLUMNS)].to_dict()}"
        )


def fit_generation_model(
    frame: pd.DataFrame, form: Literal["static", "continuous"], *, folds: int, seed: int
) -> tuple[GenerationTimeModel, dict[str, float]]:
    """Fit a `GenerationTimeModel` of `form` on per-minibatch timings and score it by K-fold cross-validation.

    Args:
        frame: one row per timed minibatch with the columns of ``metrics/profile_timings.csv``
            (``wall_s`` seconds, ``num_prompts``, ``n``, ``max_length``, ``total_tokens``, ``prompt_tokens``).
        form: ``static`` or ``continuous``.
        folds: K of the cross-validation (>= 2); seed: seeds the random fold assignment.

    Returns:
        (model fitted on all rows, report) with ``r2_heldout`` and ``mdape_heldout`` (median |pred - y| / y,
        a fraction) of the out-of-fold predictions, ``r2_in_sample``, ``minibatches`` and ``folds``.

    Raises:
        ValueError: a missing column, too few rows (< max(folds, features + 2)), bad values, unknown form.
    """
    _check_timings(frame, form, folds)
    y = frame["wall_s"].to_numpy(dtype=np.float64)
    x = generation_features(form, *(frame[c].to_numpy() for c in TIMING_COLUMNS[1:]))
    fold_of = np.arange(len(y)) % folds
    fold_of = fold_of[np.random.default_rng(seed).permutation(len(y))]
    heldout = np.empty_like(y)
    for f in range(folds):
        test = fold_of == f
        heldout[test] = np.maximum(x[test] @ nnls_fit(x[~test], y[~test]), FLOOR_S)
    coef = nnls_fit(x, y)
    model = GenerationTimeModel(form=form, coef=tuple(coef), feature_names=FEATURES[form])
    fitted = np.maximum(x @ coef, FLOOR_S)
    report = {
        "r2_heldout": r2_score(y, heldout),
        "mdape_heldout": float(np.median(np.abs(heldout - y) / y)),
        "r2_in_sample": r2_score(y, fitted),
        "minibatches": float(len(y)),
        "folds": float(folds),
        "speed_drift": speed_drift(y, fitted),
    }
    return model, report


def speed_drift(measured: np.ndarray, predicted: np.ndarray, parts: int = DRIFT_PARTS) -> float:
    """How far the machine's speed moved while the rows were timed (pure): the median ratio measured / predicted
    over each of `parts` consecutive runs of rows (the profile times its minibatches in row order), and the largest
    of those medians over the smallest, less 1. The fit has no term for time, so a machine that slowed down
    halfway shows up here (0.17: one part ran 17 % slower than another) while shapes the fit gets wrong do not,
    as long as the profile's minibatches are drawn in random order. 0 with fewer than 2 rows per part."""
    ratio = np.asarray(measured, np.float64) / np.maximum(np.asarray(predicted, np.float64), FLOOR_S)
    if len(ratio) < 2 * parts:
        return 0.0
    medians = [float(np.median(chunk)) for chunk in np.array_split(ratio, parts)]
    return max(medians) / max(min(medians), FLOOR_S) - 1.0


def drift_doubtful(drift: float) -> bool:
    """Whether the profile's `speed_drift` says the machine was unsteady while it was timed: above `DRIFT_WARN`
    (pure)."""
    return drift > DRIFT_WARN


@dataclass(frozen=True)
class TrainingTimeModel:
    """Trainer step time and weight-refresh costs (all seconds, finite, >= 0).

    Attributes:
        step_base_s: fixed part of a step (optimizer, and whatever does not grow with the batch).
        step_per_token_s: seconds per response token of the global batch.
        save_s, convert_s: snapshot export and conversion, paid on the trainer once per exported snapshot.
        load_s: reload of a snapshot, paid by each generation actor before its next minibatch (deferred reload).
        step_per_sample_s: seconds per sequence (prompt x sample) of the global batch (rewards, prompt tokens,
            padding); 0 in models saved before it existed and when fitted on one batch size.

    No defaults (but the last): a pipeline run's are the ``simulate.training`` params (asp.config), `simulated`
    builds the simulated trainer's, `fit_training_model` fits them.
    """

    step_base_s: float
    step_per_token_s: float
    save_s: float
    convert_s: float
    load_s: float
    step_per_sample_s: float

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _check_nonneg(f.name, getattr(self, f.name)))

    @classmethod
    def simulated(cls, step_s: float, refresh_delay_s: float) -> TrainingTimeModel:
        """The runtime's `SimulatedTrainer` (``runtime.trainer``): a fixed step time `step_s`, reload =
        `refresh_delay_s` per actor, no export."""
        return cls(
            step_base_s=step_s,
            step_per_token_s=0.0,
            save_s=0.0,
            convert_s=0.0,
            load_s=refresh_delay_s,
            step_per_sample_s=0.0,
        )

    def step_seconds(self, tokens: float, samples: float = 0.0) -> float:
        """Seconds of one trainer step on a global batch of `samples` sequences (prompts x samples per prompt)
        with `tokens` response tokens (>= FLOOR_S)."""
        t = self.step_base_s + self.step_per_token_s * float(tokens) + self.step_per_sample_s * float(samples)
        return max(t, FLOOR_S)

    def publish_seconds(self) -> float:
        """Trainer-side seconds of exporting one snapshot (T_save + T_convert)."""
        return self.save_s + self.convert_s

    def to_dict(self) -> dict[str, float]:
        """JSON-ready form: the five fields by name."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingTimeModel:
        """Inverse of `to_dict` (a dict without ``step_per_sample_s``, saved before it existed, loads with 0);
        raises ValueError naming the bad key or value."""
        if isinstance(data, dict) and "step_per_sample_s" not in data:
            data = {**data, "step_per_sample_s": 0.0}
        return cls(**_checked_keys(cls, data))


def _recent_median(values: pd.Series) -> float:
    """Median of the positive entries (the trainer reports 0 until the first event), 0 when there are none."""
    v = values.to_numpy(dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.median(v)) if v.size else 0.0


def _training_columns(
    frame: pd.DataFrame, n_samples: int, window: int, rate: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(y, x) of one launch: the reported trailing mean of the step time and the same trailing means of
    [1, sequences, response tokens]; with `rate` (each step's mean CPU-sharing rate, `asp.sim.sharing`) y is the
    full-speed time, the reported mean x the same trailing mean of the rate. ValueError naming a bad column or row."""
    needed = [TRAIN_TIME_COL, TRAIN_TOKENS_COL, TRAIN_PROMPTS_COL, *REFRESH_COLS.values()]
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise ValueError(f"iterations table lacks columns {missing} (a GRPO launch's iterations.parquet has them)")
    y = frame[TRAIN_TIME_COL].to_numpy(dtype=np.float64)
    tokens = frame[TRAIN_TOKENS_COL].to_numpy(dtype=np.float64)
    samples = frame[TRAIN_PROMPTS_COL].to_numpy(dtype=np.float64) * n_samples
    for name, v in ((TRAIN_TIME_COL, y), (TRAIN_TOKENS_COL, tokens), (TRAIN_PROMPTS_COL, samples)):
        bad = np.flatnonzero(~(np.isfinite(v) & (v >= 0)))
        if bad.size:
            raise ValueError(f"column {name!r} must hold finite values >= 0; row {int(bad[0])} is {float(v[bad[0]])}")
    import pandas as pd

    trail = [pd.Series(v).rolling(window, min_periods=1).mean().to_numpy() for v in (samples, tokens)]
    if rate is not None:
        if len(rate) != len(y):
            raise ValueError(f"need one sharing rate per step: {len(y)} steps, {len(rate)} rates")
        y = y * pd.Series(np.asarray(rate, np.float64)).rolling(window, min_periods=1).mean().to_numpy()
    return y, np.column_stack([np.ones_like(y), *trail])


def fit_training_model(
    iterations: pd.DataFrame | Sequence[pd.DataFrame],
    *,
    n_samples: int | Sequence[int],
    window: int = T_TRAIN_WINDOW,
    rates: Sequence[np.ndarray] | None = None,
    prompt_tokens_per_sample: float | None = None,
) -> tuple[TrainingTimeModel, dict[str, float]]:
    """Fit a `TrainingTimeModel` on GRPO launches' per-iteration tables (``outputs/launch/iterations.parquet``).

    Step time: ``train/t_train_s`` is what `GRPOTrainer.step` spends on rewards and the update (export and
    checkpoint excluded; ``runtime/train_step_s`` includes them, so it is not used). The trainer reports it as
    the mean of its last `window` steps, so it is regressed on the same trailing means of the features; a linear
    model commutes with that mean, so the coefficients are those of a single step. Features: 1, the step's
    sequences (``train/prompts`` x the launch's `n_samples`) and ``train/response_tokens`` (the response tokens
    the step's loss covered, i.e. the generated tokens of the trained global batch). Sequences are fitted freely
    only when they vary (several launches with different batch sizes); otherwise ``step_per_sample_s`` is the
    per-token cost x `prompt_tokens_per_sample` (or 0 without it), ``samples_varied`` 0 in the report. A resumed
    run restarts the trainer's window, which this ignores. Refresh costs: medians over steps of the positive
    ``train/t_save_s``, ``train/t_convert_s``, ``train/t_load_s`` (themselves recent means; 0 before the first
    event).

    Args:
        iterations: one table per launch, one row per trainer step (sorted by ``step`` when present).
        n_samples: samples per prompt of each launch (one value for all, or one per table).
        window: steps in the trainer's trailing mean of ``train/t_train_s``.
        rates: per table, each step's mean CPU-sharing rate in step order (`asp.sim.sharing.mean_rates`): the
            model is then the full-speed one (the step times x their rates); None: the times as measured.
        prompt_tokens_per_sample: the prompt tokens of one sequence (the profile's mean). Where the batch size
            does not vary, the per-sequence cost is then the per-token cost x this (the trainer's forward and
            backward cover prompt and response tokens alike), fitted on response + prompt tokens, so a launch of
            one batch size extrapolates to another; None: the per-sequence cost is 0 there.

    Returns:
        (model, report) with ``r2_in_sample`` (of the trailing means; there is no held-out score here),
        ``steps``, ``launches``, ``samples_varied``, ``window`` and the fitted values.

    Raises:
        ValueError: a missing column, fewer than 3 steps in a table, or non-finite / negative times or counts.
    """
    import pandas as pd

    frames = [iterations] if isinstance(iterations, pd.DataFrame) else list(iterations)
    counts = [n_samples] * len(frames) if isinstance(n_samples, int) else list(n_samples)
    if not frames or len(counts) != len(frames):
        raise ValueError(f"need one or more tables and one n_samples per table, got {len(frames)} and {len(counts)}")
    if window < 1 or min(counts) < 1:
        raise ValueError(f"window and n_samples must be >= 1, got window {window}, n_samples {counts}")
    if rates is not None and len(rates) != len(frames):
        raise ValueError(f"need one array of sharing rates per table, got {len(rates)} for {len(frames)} tables")
    ys, xs, sorted_frames = [], [], []
    for i, frame in enumerate(frames):
        frame = frame.sort_values("step") if "step" in frame.columns else frame
        if len(frame) < 3:
            raise ValueError(f"need at least 3 trainer steps per launch, table {i} has {len(frame)}")
        y, x = _training_columns(frame, counts[i], window, None if rates is None else rates[i])
        ys.append(y)
        xs.append(x)
        sorted_frames.append(frame)
    y, x = np.concatenate(ys), np.vstack(xs)
    varied = bool(np.ptp(x[:, 1]) > 0)
    if varied:
        coef = nnls_fit(x, y)
    elif prompt_tokens_per_sample is not None:  # a prompt token costs what a response token costs
        ptps = _check_nonneg("prompt_tokens_per_sample", prompt_tokens_per_sample)
        base, per_token = nnls_fit(np.column_stack([x[:, 0], x[:, 2] + ptps * x[:, 1]]), y)
        coef = np.array([base, per_token * ptps, per_token])
    else:
        coef = np.insert(nnls_fit(x[:, [0, 2]], y), 1, 0.0)
    both = pd.concat(sorted_frames)
    refresh = {name: _recent_median(both[col]) for name, col in REFRESH_COLS.items()}
    model = TrainingTimeModel(
        step_base_s=float(coef[0]), step_per_token_s=float(coef[2]), step_per_sample_s=float(coef[1]), **refresh
    )
    report = {
        "r2_in_sample": r2_score(y, x @ coef),
        "steps": float(len(y)),
        "launches": float(len(frames)),
        "samples_varied": float(varied),
        "window": float(window),
    }
    report.update({k: float(v) for k, v in model.to_dict().items()})
    return model, report


def shared(gen: GenerationTimeModel, factor: float) -> GenerationTimeModel:
    """`gen` with every coefficient times `factor` (generation under CPU sharing = alone x factor)."""
    f = _check_nonneg("sharing factor", factor)
    return GenerationTimeModel(gen.form, tuple(c * f for c in gen.coef), gen.feature_names)
