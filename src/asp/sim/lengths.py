"""Length model of the simulator: realized response lengths of scheduled prompts without running the policy.

The schedule knows each prompt's calibrated expected length c_p; the simulator needs the n lengths it will
really produce. `LengthModel` is a two-level lognormal around c_p, fitted out of sample on profiled prompts the
predictor and the calibration map were not fitted on (the caller passes the out-of-fold calibrated lengths of
`asp.predictor.calibration.cross_fit_calibration`):

    L_pj = clip(round(c_p * exp(bias + u_p + e_pj)), 1, max_new_tokens),
    u_p ~ N(0, sigma_prompt^2) per prompt,  e_pj ~ N(-sigma_sample^2 / 2, sigma_sample^2) per sample.

Mean correction: the within-prompt noise has mean -sigma_sample^2 / 2, so E[exp(e)] = 1 and a prompt's
expected length is c_p * exp(bias + u_p). That is the quantity `bias` and `sigma_prompt` are measured on (the
log ratio of a prompt's realized MEAN length to c_p), so nothing is counted twice. The prompt term gets no
correction: `bias` is the mean log ratio, and for lognormal ratios E[exp(bias + u)] = exp(bias +
sigma_prompt^2 / 2) is the mean ratio the data showed; a calibrated predictor (E[mean / c] = 1) fits bias close
to -sigma_prompt^2 / 2, and the simulated mean length is then c_p on average. The cap lowers it where the
lognormal puts mass above max_new_tokens, as it does in the profile.

Fitting (`fit_length_model`): r_p = log(mean_p) - log(c_p); the mean of n lognormal samples is itself noisy,
log(mean_p) has variance v_p ~= (exp(sigma_sample^2) - 1) / n_p and mean -v_p / 2 (delta method), so
sigma_prompt^2 = var(r) - mean(v) (clipped at 0) and bias = mean(r + v / 2). sigma_sample is the pooled
within-prompt standard deviation of log(max(length, 1)). Samples cut at the cap are kept as they are (their log
is censored, which lowers sigma_sample a little); the report gives the truncated fraction.

Run the tests with ``.venv/bin/python -m pytest tests/sim/test_lengths.py -q``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from asp.sim.checks import positive_int


@dataclass(frozen=True)
class LengthModel:
    """Two-level lognormal noise of realized lengths around the calibrated expected length.

    Attributes:
        sigma_prompt: std of a prompt's log(realized mean / calibrated expected length), sampling noise removed.
        sigma_sample: pooled within-prompt std of log sample length.
        bias: mean log ratio of realized mean to calibrated expected length.
        max_new_tokens: the generation cap (tokens); sampled lengths never exceed it.
    """

    sigma_prompt: float
    sigma_sample: float
    bias: float
    max_new_tokens: int

    def __post_init__(self) -> None:
        for name in ("sigma_prompt", "sigma_sample", "bias"):
            value = getattr(self, name)
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be a number, got {value!r}") from None
            if not math.isfinite(v) or (name != "bias" and v < 0):
                raise ValueError(f"{name} must be finite{'' if name == 'bias' else ' and >= 0'}, got {value!r}")
            object.__setattr__(self, name, v)
        object.__setattr__(self, "max_new_tokens", positive_int("max_new_tokens", self.max_new_tokens))

    def sample(self, expected: np.ndarray, n_samples: int, rng: np.random.Generator) -> np.ndarray:
        """`sample_lengths` with this model: int32 (P, n)."""
        return sample_lengths(self, expected, n_samples, rng)

    def sample_visits(
        self, expected: np.ndarray, n_samples: int, visits: int, rng: np.random.Generator, later: np.random.Generator
    ) -> np.ndarray:
        """int32 (V, P, n): the lengths of `visits` visits of each prompt. Visit 0 is `sample` on `rng`; a later
        visit keeps each prompt's effect u_p (a long prompt stays long) and draws its samples' e_pj again from
        `later`, as a policy sampling the same prompt again does."""
        c = _positive_1d("expected", expected)
        u, first = _draw(self, c, n_samples, rng)
        again = (_lengths(self, c, u, n_samples, later) for _ in range(1, positive_int("visits", visits)))
        return np.stack([first, *again])

    def mean_factor(self) -> float:
        """E[L / c] before the cap: exp(bias + sigma_prompt^2 / 2) (1 for a well calibrated predictor)."""
        return math.exp(self.bias + self.sigma_prompt**2 / 2)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the four fields by name."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LengthModel:
        """Inverse of `to_dict`; raises ValueError naming the bad key or value."""
        if not isinstance(data, dict):
            raise ValueError(f"LengthModel.from_dict needs a dict, got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        unknown, missing = sorted(set(data) - names), sorted(names - set(data))
        if unknown or missing:
            raise ValueError(f"LengthModel.from_dict: unknown keys {unknown}, missing keys {missing}")
        return cls(**data)


def _positive_1d(name: str, values: np.ndarray) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {a.shape}")
    bad = ~(np.isfinite(a) & (a > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must be finite and > 0; entry {i} is {float(a[i])}")
    return a


def _check_samples(lengths: np.ndarray, index: np.ndarray, prompts: int, cap: int) -> None:
    if lengths.ndim != 1 or lengths.shape != index.shape or lengths.size == 0:
        raise ValueError(
            f"sample_lengths and prompt_index must be equal non-empty 1-D arrays, got "
            f"{lengths.shape} and {index.shape}"
        )
    if not np.all(np.isfinite(lengths)) or lengths.min() < 0 or lengths.max() > cap:
        raise ValueError(
            f"sample_lengths must be finite and within [0, max_new_tokens={cap}]; "
            f"got min {lengths.min()}, max {lengths.max()}"
        )
    if not np.issubdtype(index.dtype, np.integer) or index.min() < 0 or index.max() >= prompts:
        raise ValueError(f"prompt_index must hold integers in [0, {prompts}) (positions in predicted)")
    counts = np.bincount(index, minlength=prompts)
    if (counts == 0).any():
        raise ValueError(f"prompt {int(np.flatnonzero(counts == 0)[0])} has no samples")
    if (counts < 2).all():
        raise ValueError("no prompt has 2 or more samples: the within-prompt spread cannot be measured")


def fit_length_model(
    predicted: np.ndarray,
    calibrated_out_of_fold: np.ndarray,
    sample_lengths: np.ndarray,
    prompt_index: np.ndarray,
    max_new_tokens: int,
) -> tuple[LengthModel, dict[str, float]]:
    """Fit a `LengthModel` on profiled prompts (see the module docstring for the estimators).

    Args:
        predicted: [P] raw predicted lengths (tokens; used for the report's ``sigma_prompt_uncalibrated``).
        calibrated_out_of_fold: [P] cross-fitted calibrated expected lengths (tokens), same prompts.
        sample_lengths: [N] realized response lengths (tokens, 0..max_new_tokens).
        prompt_index: [N] int position in `predicted` of each sample's prompt; every prompt needs >= 1 sample.
        max_new_tokens: the cap the samples were generated with.

    Returns:
        (model, report) with ``prompts``, ``samples``, ``sigma_prompt``, ``sigma_prompt_raw`` (before removing
        the sampling noise of the means), ``sigma_prompt_uncalibrated`` (raw predictions instead of calibrated),
        ``sigma_sample``, ``bias``, ``truncated_fraction`` (samples at the cap) and ``mean_factor``.

    Raises:
        ValueError: mismatched shapes, non-positive predictions, lengths outside [0, cap], bad indices, or no
            prompt with two samples.
    """
    pred = _positive_1d("predicted", predicted)
    cal = _positive_1d("calibrated_out_of_fold", calibrated_out_of_fold)
    if pred.shape != cal.shape:
        raise ValueError(f"predicted and calibrated_out_of_fold differ in shape: {pred.shape} vs {cal.shape}")
    lengths, index = np.asarray(sample_lengths, dtype=np.float64), np.asarray(prompt_index)
    cap = LengthModel(0.0, 0.0, 0.0, max_new_tokens).max_new_tokens  # validates the cap
    _check_samples(lengths, index, pred.size, cap)
    counts = np.bincount(index, minlength=pred.size).astype(np.float64)
    logs = np.log(np.maximum(lengths, 1.0))
    mean_log = np.bincount(index, logs, minlength=pred.size) / counts
    sigma_sample = math.sqrt(float(np.sum((logs - mean_log[index]) ** 2)) / (lengths.size - pred.size))
    log_mean = np.log(np.maximum(np.bincount(index, lengths, minlength=pred.size) / counts, 1.0))
    ratio = log_mean - np.log(cal)
    noise = math.expm1(sigma_sample**2) / counts  # variance of log(mean of n_p samples), delta method
    var = float(np.var(ratio, ddof=1)) if pred.size > 1 else 0.0
    model = LengthModel(
        sigma_prompt=math.sqrt(max(var - float(noise.mean()), 0.0)),
        sigma_sample=sigma_sample,
        bias=float(np.mean(ratio + noise / 2)),
        max_new_tokens=cap,
    )
    uncal = log_mean - np.log(pred)
    report = {
        "prompts": float(pred.size),
        "samples": float(lengths.size),
        "sigma_prompt": model.sigma_prompt,
        "sigma_prompt_raw": math.sqrt(var),
        "sigma_prompt_uncalibrated": float(np.std(uncal, ddof=1)) if pred.size > 1 else 0.0,
        "sigma_sample": model.sigma_sample,
        "bias": model.bias,
        "truncated_fraction": float(np.mean(lengths >= cap)),
        "mean_factor": model.mean_factor(),
    }
    return model, report


def sample_lengths(model: LengthModel, expected: np.ndarray, n_samples: int, rng: np.random.Generator) -> np.ndarray:
    """Draw realized lengths for P prompts, n each (deterministic for a given generator state).

    Draws the P prompt effects first, then the P x n sample effects (float32 normals, so P = 10^6 fits easily).

    Args:
        model: the fitted `LengthModel`.
        expected: [P] calibrated expected lengths (tokens, > 0).
        n_samples: samples per prompt (>= 1).
        rng: numpy Generator; it is advanced by P + P * n normal draws.

    Returns:
        int32 [P, n] lengths in [1, model.max_new_tokens].
    """
    return _draw(model, _positive_1d("expected", expected), n_samples, rng)[1]


def _draw(
    model: LengthModel, c: np.ndarray, n_samples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(the prompt effects u [P], the lengths [P, n]) of `sample_lengths`."""
    n = positive_int("n_samples", n_samples)
    u = rng.standard_normal(c.size, dtype=np.float32) * np.float32(model.sigma_prompt)
    return u, _lengths(model, c, u, n, rng)


def _lengths(model: LengthModel, c: np.ndarray, u: np.ndarray, n_samples: int, rng: np.random.Generator) -> np.ndarray:
    """int32 [P, n] lengths of prompts with expected lengths `c` and prompt effects `u`, fresh sample effects."""
    log_len = rng.standard_normal((c.size, int(n_samples)), dtype=np.float32)
    log_len *= np.float32(model.sigma_sample)
    base = np.log(c) + model.bias - model.sigma_sample**2 / 2 + u
    log_len += base.astype(np.float32)[:, None]
    np.minimum(log_len, np.float32(math.log(model.max_new_tokens) + 1.0), out=log_len)  # no overflow in exp
    out = np.rint(np.exp(log_len))
    return np.clip(out, 1, model.max_new_tokens).astype(np.int32)


@dataclass(frozen=True)
class EmpiricalLengthModel:
    """Nearest-neighbour block bootstrap of realized lengths (the simulator's default).

    A lognormal with one pooled spread misses the occasional long sample that sets a static batch's decode
    steps (the max of a minibatch's lengths). This model keeps the profile's own shape instead: for a prompt with
    calibrated expected length c it picks one of the `neighbors` held-out prompts whose cross-fitted calibrated
    length is closest to c, and scales that prompt's realized samples by c / its calibrated length. Prompt-level
    error (the ratio's row mean), within-prompt spread and tails all come from data the predictor and the
    calibration were not fitted on.

    Attributes:
        calibrated: (H,) held-out prompts' out-of-fold calibrated lengths, ascending.
        ratios: (H, m) their realized sample lengths / calibrated length, same order.
        neighbors: how many nearest held-out prompts a draw chooses among.
        max_new_tokens: the cap; sampled lengths lie in [1, cap].
    """

    calibrated: np.ndarray
    ratios: np.ndarray
    neighbors: int
    max_new_tokens: int

    def __post_init__(self) -> None:
        cal, ratios = np.asarray(self.calibrated, np.float64), np.asarray(self.ratios, np.float64)
        if cal.ndim != 1 or ratios.ndim != 2 or ratios.shape[0] != cal.size or cal.size == 0 or ratios.shape[1] == 0:
            raise ValueError(f"need calibrated (H,) and ratios (H, m) with H, m >= 1, got {cal.shape}, {ratios.shape}")
        if not (np.isfinite(cal).all() and (cal > 0).all() and np.isfinite(ratios).all() and (ratios >= 0).all()):
            raise ValueError("calibrated lengths must be finite and > 0, ratios finite and >= 0")
        if np.any(np.diff(cal) < 0):
            raise ValueError("calibrated lengths must be sorted ascending")
        if isinstance(self.neighbors, bool) or int(self.neighbors) < 1:
            raise ValueError(f"neighbors must be an integer >= 1, got {self.neighbors!r}")
        LengthModel(0.0, 0.0, 0.0, self.max_new_tokens)  # validates the cap
        object.__setattr__(self, "calibrated", cal)
        object.__setattr__(self, "ratios", ratios)

    def sample(self, expected: np.ndarray, n_samples: int, rng: np.random.Generator) -> np.ndarray:
        """int32 (P, n) lengths for P prompts with calibrated expected lengths `expected` (deterministic per rng).

        n <= m takes n consecutive samples (cyclically, from a random offset) of the chosen row; n > m draws the
        row's samples with replacement.
        """
        c = _positive_1d("expected", expected)
        return self._at(c, *self._rows_cols(c, n_samples, rng))

    def sample_visits(
        self, expected: np.ndarray, n_samples: int, visits: int, rng: np.random.Generator, later: np.random.Generator
    ) -> np.ndarray:
        """int32 (V, P, n): the lengths of `visits` visits of each prompt. Visit 0 is `sample` on `rng`. A later
        visit keeps each prompt's level (its held-out row's mean ratio: a long prompt stays long) and draws each
        sample's deviation from that level afresh, from `later`: a random sample of a random row among the same
        nearest `neighbors`, over that row's mean. The profile holds only m samples a prompt, so drawing the row's own
        samples again would hand the next visit nearly the same lengths, where a policy sampling a prompt again
        does not repeat them."""
        c = _positive_1d("expected", expected)
        rows, cols = self._rows_cols(c, n_samples, rng)
        level = self.ratios.mean(axis=1)
        lo, k = self._window(c)
        m = self.ratios.shape[1]

        def again() -> np.ndarray:
            other = lo[:, None] + later.integers(0, k, size=cols.shape)
            shape = self.ratios[other, later.integers(0, m, size=cols.shape)] / np.maximum(level[other], 1e-12)
            return self._capped(level[rows][:, None] * shape * c[:, None])

        return np.stack([self._at(c, rows, cols), *(again() for _ in range(1, positive_int("visits", visits)))])

    def _window(self, c: np.ndarray) -> tuple[np.ndarray, int]:
        """The first of each prompt's `neighbors` nearest held-out rows, and how many there are."""
        h = self.ratios.shape[0]
        k = min(int(self.neighbors), h)
        return np.clip(np.searchsorted(self.calibrated, c) - k // 2, 0, h - k), k

    def _rows_cols(self, c: np.ndarray, n_samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Each prompt's held-out row (among its nearest `neighbors`) and the columns of its n samples."""
        n = positive_int("n_samples", n_samples)
        m = self.ratios.shape[1]
        lo, k = self._window(c)
        rows = lo + rng.integers(0, k, size=c.size)
        if n <= m:
            cols = (rng.integers(0, m, size=(c.size, 1)) + np.arange(n)) % m
        else:
            cols = rng.integers(0, m, size=(c.size, n))
        return rows, cols

    def _at(self, c: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return self._capped(self.ratios[rows[:, None], cols] * c[:, None])

    def _capped(self, lengths: np.ndarray) -> np.ndarray:
        """int32 `lengths` rounded and held in [1, max_new_tokens]."""
        return np.clip(np.rint(lengths), 1, self.max_new_tokens).astype(np.int32)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "empirical",
            "calibrated": self.calibrated.tolist(),
            "ratios": self.ratios.tolist(),
            "neighbors": int(self.neighbors),
            "max_new_tokens": int(self.max_new_tokens),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmpiricalLengthModel:
        keys = {"kind", "calibrated", "ratios", "neighbors", "max_new_tokens"}
        if not isinstance(data, dict) or set(data) != keys or data["kind"] != "empirical":
            raise ValueError(f"empirical length model needs exactly the keys {sorted(keys)} with kind 'empirical'")
        return cls(
            np.asarray(data["calibrated"]), np.asarray(data["ratios"]), data["neighbors"], data["max_new_tokens"]
        )


def fit_empirical_length_model(
    calibrated_out_of_fold: np.ndarray,
    sample_lengths: np.ndarray,
    prompt_index: np.ndarray,
    max_new_tokens: int,
    neighbors: int = 20,
) -> tuple[EmpiricalLengthModel, dict[str, float]]:
    """Build an `EmpiricalLengthModel` from held-out profiled prompts.

    Args:
        calibrated_out_of_fold: (P,) cross-fitted calibrated expected lengths (tokens, > 0).
        sample_lengths: (N,) realized lengths; prompt_index: (N,) position of each sample's prompt.
        max_new_tokens: the cap. neighbors: nearest prompts a draw chooses among.

    Returns:
        (model, report): ``prompts``, ``samples_per_prompt`` (m: every prompt keeps its first m samples, m = the
        smallest count), ``neighbors``, ``truncated_fraction``, ``mean_ratio`` (realized / calibrated).

    Raises:
        ValueError: as `fit_length_model`.
    """
    cal = _positive_1d("calibrated_out_of_fold", calibrated_out_of_fold)
    lengths, index = np.asarray(sample_lengths, dtype=np.float64), np.asarray(prompt_index)
    _check_samples(lengths, index, cal.size, int(max_new_tokens))
    order = np.argsort(index, kind="stable")
    counts = np.bincount(index, minlength=cal.size)
    m = int(counts.min())
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    table = lengths[order][starts[:, None] + np.arange(m)]  # (P, m): each prompt's first m samples
    sort = np.argsort(cal, kind="stable")
    model = EmpiricalLengthModel(cal[sort], (table / cal[:, None])[sort], neighbors, max_new_tokens)
    report = {
        "prompts": float(cal.size),
        "samples_per_prompt": float(m),
        "neighbors": float(neighbors),
        "truncated_fraction": float(np.mean(lengths >= max_new_tokens)),
        "mean_ratio": float(np.mean(table / cal[:, None])),
    }
    return model, report
