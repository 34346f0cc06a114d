"""CPU sharing among generation engines and the trainer, measured from a launch's own records (pure, no I/O).

On a CPU machine (the demo: 2 cores) the generation actors and the GRPO trainer run on the same cores. The
simulator models that as processor sharing by thread demand: at any moment the demand is ``threads_per_actor``
per decoding actor plus ``trainer_threads`` while a trainer step runs, and every one of them progresses at
``min(1, cores / demand)`` of its full speed. Full speed is what the pipeline measured alone: the profile's
generation-time fit (one engine timed alone) and the training-time model. One residual factor, ``generation_factor``,
scales generation beyond that (what processor sharing leaves out: memory bandwidth, Ray's own processes).

Measured contention instead of processor sharing (`ContentionTable`, ``simulate.sharing: measured``): the slowdown of a
generation call with k engines decoding at once, with and without a training step beside them, and of a training step
beside k decoding engines, as `asp simulate probe-sharing` measured them on the machine itself
(`asp.runtime.contention`). Then the rates come from the table (what processor sharing by thread demand leaves out is
in it: 3 one-thread engines on 2 cores each ran at 1/1.68 of their speed alone in the committed probe, beside a
training step at 1/2.33), and no trainer demand is fitted. A probe that also timed each process alone (`ProbeAnchor`:
the GRPO step alone, calls of one engine alone) gives full speed itself: `anchored_training` and
`anchored_generation_factor` turn those into the training model and ``generation_factor``, and the launch then only
gives the refresh costs and a check. Without that, ``generation_factor`` and the training model are fitted from the
launch.

`fit_cpu_sharing` finds ``trainer_threads`` and ``generation_factor`` from one or more launches: every generation
call's interval (``minibatches.parquet``: ``gen_start_s``, ``gen_s``) and every trainer step's interval
(``iterations.parquet``: a step ends at the running sum of ``runtime/iteration_time_s`` and lasts
``runtime/train_step_s``) give, for a candidate ``trainer_threads``, the mean sharing rate each call and step
ran at. A call's full-speed work is then ``gen_s x rate``: the factor is the least-squares ratio of that work to
the profile fit's prediction, and the trainer's full-speed step times (``train/t_train_s x rate``) are what
`asp.sim.timemodel.fit_training_model` fits. The ``trainer_threads`` kept is the one whose model, run back through
the measured contention, predicts the calls' and steps' times best (median absolute percentage error, summed).

    from asp.sim.sharing import fit_cpu_sharing
    sharing, train, report = fit_cpu_sharing([minibatches], [iterations], gen, prompt_tokens, cores=2.0, ...)
    fit_cpu_sharing(..., contention=ContentionTable.from_dict(probe), anchor=ProbeAnchor.from_probe(probe))

Tests: tests/sim/test_sharing.py (hand-worked intervals).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from asp.sim.timemodel import FLOOR_S, GenerationTimeModel, TrainingTimeModel

CALL_COLUMNS = ("gen_start_s", "gen_s", "prompts", "responses", "tokens", "max_length")
ANCHOR_CALL_KEYS = ("seconds", "prompts", "responses", "tokens", "max_length", "prompt_tokens")
STEP_COLUMNS = ("runtime/iteration_time_s", "runtime/train_step_s")
TRAINER_THREADS_GRID = tuple(np.round(np.arange(0.0, 3.01, 0.125), 3))  # candidates of fit_cpu_sharing
NEAR_BEST = 0.01  # candidates within this summed MdAPE of the best are reported as equally supported
PROBE_CLOCK_WARN = 0.10  # the probe's calls alone this far from the profile's fit: the two did not time the same thing
PROBE_LEVEL = 0.9  # confidence of the sharing probe's slowdown intervals (`probe_intervals`)
# A probe's interval (over its own rounds) widened this much about its value holds another sitting's probe 9 times in
# 10: fitted on 7 vLLM probes of 2026-12-06/07 (90 % of the 336 pairs; unwidened 60 %), checked on 5 hf probes held
# out (96 % of 160; unwidened 62 %). `benchmarks/probe_spread.py` prints both.
SITTING_WIDTH = 2.8


@dataclass(frozen=True)
class CpuSharing:
    """How the launch's processes share the cores (see the module docstring).

    Attributes:
        trainer_threads: the trainer's demand on the shared cores while a step runs (0: it has its own device).
        generation_factor: generation time at full speed = the profile fit x this.
    """

    trainer_threads: float
    generation_factor: float


@dataclass(frozen=True)
class ContentionTable:
    """Measured slowdowns on shared cores (``metrics/sharing_probe.json``, `asp.runtime.contention`).

    Attributes:
        generation: row k - 1 for k = 1..K engines decoding at once: (a call's time / one engine's time alone
            with no training step running, the same with a training step running).
        training: entry k - 1: a training step's time beside k decoding engines / its time alone.

    Beyond the K measured engines the last row is scaled as processor sharing would: s(k) = s(K) x k / K.
    """

    generation: tuple[tuple[float, float], ...]
    training: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.generation or len(self.generation) != len(self.training):
            raise ValueError(
                f"a contention table needs one generation row and one training entry per engine count, got "
                f"{len(self.generation)} and {len(self.training)}"
            )
        for value in [v for row in self.generation for v in row] + list(self.training):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"contention slowdowns must be finite and > 0, got {value}")

    @classmethod
    def from_dict(cls, data: dict) -> ContentionTable:
        """From the probe file's ``generation_slowdown`` ([[alone, with training], ...]) and ``training_slowdown``.

        Raises:
            ValueError: a missing key or a bad value.
        """
        try:
            gen = tuple((float(a), float(b)) for a, b in data["generation_slowdown"])
            train = tuple(float(v) for v in data["training_slowdown"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"not a sharing probe (generation_slowdown: [[alone, with training], ...], training_slowdown: "
                f"[...]): {exc}"
            ) from None
        return cls(gen, train)

    def slowdowns(self, decoding: np.ndarray, training: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a call's slowdown, a step's slowdown) with `decoding` engines decoding and `training` (bool) a step
        running; 1 where the process is alone (no engine decoding beside a step, or no call)."""
        k = np.asarray(decoding, np.int64)
        train_on = np.asarray(training, bool)
        top = len(self.generation)
        idx = np.clip(k, 1, top) - 1
        scale = np.where(k > top, k / top, 1.0)
        gen = np.asarray(self.generation, np.float64)
        call = np.where(k >= 1, gen[idx, train_on.astype(np.int64)] * scale, 1.0)
        step = np.where(train_on & (k >= 1), np.asarray(self.training, np.float64)[idx] * scale, 1.0)
        return call, step


def median_interval(values: Sequence[float], level: float = PROBE_LEVEL) -> tuple[float, float]:
    """A distribution-free interval for the median of `values` (pure): the order statistics x_(r) and x_(n-r+1)
    with r the largest whose coverage 1 - 2 P(B <= r - 1), B ~ Binomial(n, 1/2), is at least `level`; [min, max]
    when even that falls short (few values). It takes the values as independent draws.

    Raises:
        ValueError: no value, or `level` not in (0, 1).
    """
    x = np.sort(np.asarray(values, np.float64))
    n = len(x)
    if n == 0 or not 0 < level < 1:
        raise ValueError(f"need values and a level in (0, 1), got {n} values and {level}")
    tail = (1 - level) / 2
    r, cdf = 1, 0.5**n  # cdf: P(B <= r - 1)
    while r < n and cdf + math.comb(n, r) * 0.5**n <= tail:
        cdf += math.comb(n, r) * 0.5**n
        r += 1
    return float(x[r - 1]), float(x[n - r])


def probe_intervals(
    data: dict, level: float = PROBE_LEVEL, widen: float = 1.0
) -> dict[tuple[int, bool, str], tuple[float, float, float]] | None:
    """Each slowdown of a sharing probe's record with its `median_interval` from the per-round ratios it kept
    (``rounds_ratios``): (engines k, training beside, "call" or "step") -> (median, low, high); None for a record
    without them (pure). The ratios within a round share that round's baselines, and the machine's speed moves
    between sittings, so such an interval holds another sitting's probe less often than `level` says (about 60 %
    at 90 %). `widen` stretches each end away from the median by that factor (`SITTING_WIDTH`: the range another
    sitting's probe falls in 9 times in 10); a low end stays at or above min(1, its unwidened value), as a slowdown
    below 1 is only measurement noise.

    Raises:
        ValueError: ``rounds_ratios`` is not {"k" or "k+training": {"calls": [...], "steps": [...]}}, or `widen`
            is below 1.
    """
    if not widen >= 1.0:
        raise ValueError(f"widen must be >= 1, got {widen}")
    rounds = data.get("rounds_ratios")
    if not rounds:
        return None
    out: dict[tuple[int, bool, str], tuple[float, float, float]] = {}
    try:
        for name, setting in rounds.items():
            k, training = int(name.split("+")[0]), name.endswith("+training")
            for kind, key in (("call", "calls"), ("step", "steps")):
                values = [float(v) for v in setting.get(key) or ()]
                if values:
                    mid = float(np.median(values))
                    low, high = median_interval(values, level)
                    low = max(mid - widen * (mid - low), min(1.0, low))
                    out[(k, training, kind)] = (mid, low, mid + widen * (high - mid))
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"rounds_ratios: not per-setting ratios ({exc})") from None
    return out


def bound_tables(
    table: ContentionTable, intervals: dict[tuple[int, bool, str], tuple[float, float, float]]
) -> tuple[ContentionTable, ContentionTable]:
    """`table` with every slowdown at the low and at the high end of its interval (`probe_intervals`; a slowdown
    without one stays as it is): the two ends of the range the probe's own spread allows (pure)."""

    def at(end: int) -> ContentionTable:
        def call(k: int, training: bool, value: float) -> float:
            return intervals.get((k, training, "call"), (value, value, value))[end]

        gen = tuple(
            (call(k, False, alone), call(k, True, beside)) for k, (alone, beside) in enumerate(table.generation, 1)
        )
        train = tuple(intervals.get((k, True, "step"), (v, v, v))[end] for k, v in enumerate(table.training, start=1))
        return ContentionTable(gen, train)

    return at(1), at(2)


@dataclass(frozen=True)
class ProbeAnchor:
    """What the sharing probe timed alone on the machine's cores: the trainer's step (seconds with the snapshot
    export, response tokens, sequences) and the calls of one engine alone (`ANCHOR_CALL_KEYS` each; empty in a
    probe that did not record them)."""

    step_seconds: float
    step_tokens: float
    step_sequences: float
    calls: tuple[dict[str, float], ...] = ()

    @classmethod
    def from_probe(cls, data: dict) -> ProbeAnchor | None:
        """From a sharing probe's ``alone_step_s``, ``training_load`` (``response_tokens``, ``sequences``) and
        ``alone_calls``; None for a probe without the step's (one made with the trainer stand-in)."""
        load = data.get("training_load") or {}
        if "response_tokens" not in load or "alone_step_s" not in data:
            return None
        calls = tuple(dict(c) for c in data.get("alone_calls") or ())
        return cls(float(data["alone_step_s"]), float(load["response_tokens"]), float(load["sequences"]), calls)

    @classmethod
    def from_trainer_alone(cls, data: dict) -> ProbeAnchor | None:
        """From the trainer_alone stage's metrics (``trainer_alone/step_s``, ``/response_tokens``, ``/sequences``:
        the step timed alone in the pipeline's sitting; no call), or None where it timed nothing."""
        if not data.get("trainer_alone/timed") or "trainer_alone/step_s" not in data:
            return None
        return cls(
            float(data["trainer_alone/step_s"]),
            float(data["trainer_alone/response_tokens"]),
            float(data["trainer_alone/sequences"]),
        )


def probe_clock_doubtful(clock: float | None, trainer: str, step_timed_in_sitting: bool) -> bool:
    """Whether the probe's clock (``probe_clock``: its calls of one engine alone over the profile's fit) says the two
    timed the same engine at different speeds, more than `PROBE_CLOCK_WARN` apart, where it moves a simulated time:
    only a GRPO `trainer`'s step (`on_profile_clock`), and not when that step was timed in the pipeline's sitting (the
    trainer_alone stage); generation is the profile's own and the simulated trainer computes nothing (pure)."""
    moves_a_time = trainer == "grpo" and not step_timed_in_sitting
    return clock is not None and moves_a_time and abs(clock - 1.0) > PROBE_CLOCK_WARN


def anchored_generation_factor(gen: GenerationTimeModel, calls: Sequence[dict[str, float]]) -> float:
    """The generation factor that makes the profile fit predict calls of one engine alone on this machine (the
    sharing probe's ``alone_calls``: seconds, prompts, responses, tokens, max_length, prompt_tokens): the
    least-squares ratio of their seconds to the fit's (pure).

    Raises:
        ValueError: no call, or a call without its keys.
    """
    if not calls:
        raise ValueError("no call of one engine alone")
    try:
        cols = {k: np.asarray([float(c[k]) for c in calls]) for k in ANCHOR_CALL_KEYS}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"a call of one engine alone lacks {exc}") from None
    prompts = np.maximum(cols["prompts"], 1.0)
    predicted = gen.seconds_many(
        prompts, cols["responses"] / prompts, cols["max_length"], cols["tokens"], cols["prompt_tokens"]
    )
    return fit_generation_factor(cols["seconds"], predicted)


def anchored_training(
    model: TrainingTimeModel, anchor: ProbeAnchor, prompt_tokens_per_prompt: float
) -> TrainingTimeModel:
    """`model` (its refresh costs kept) with the step's full-speed cost set so the anchor's step takes the anchor's
    seconds: per token (response and prompt tokens alike, as `fit_training_model` takes one launch's) =
    (seconds - export) / (tokens + prompt tokens x sequences), per sequence = that x the prompt tokens, no fixed
    part (pure).

    Raises:
        ValueError: the anchor's step is not longer than the export, or holds no token.
    """
    work = anchor.step_seconds - model.publish_seconds()
    denom = anchor.step_tokens + prompt_tokens_per_prompt * anchor.step_sequences
    if not work > 0 or not denom > 0:
        raise ValueError(
            f"the step timed alone ({anchor.step_seconds:.4g} s, {anchor.step_tokens:g} tokens, "
            f"{anchor.step_sequences:g} sequences) must outlast the export ({model.publish_seconds():.4g} s) and "
            "hold tokens"
        )
    per_token = work / denom
    return TrainingTimeModel(
        step_base_s=0.0,
        step_per_token_s=per_token,
        save_s=model.save_s,
        convert_s=model.convert_s,
        load_s=model.load_s,
        step_per_sample_s=per_token * prompt_tokens_per_prompt,
    )


def on_profile_clock(
    gen: GenerationTimeModel, model: TrainingTimeModel, anchor: ProbeAnchor, prompt_tokens_per_prompt: float
) -> tuple[TrainingTimeModel, float]:
    """The trainer's full-speed times moved from the sharing probe's sitting onto the profile's (pure).

    The profile times one engine alone in the sitting the pipeline runs in; the probe was timed in another, and one
    machine's speed moves between sittings (tens of percent on a shared VM). ``clock`` =
    `anchored_generation_factor` of the probe's calls of one engine alone against `gen` (the profile's fit): how
    much slower the probe's sitting ran the same engine. Generation at full speed is then `gen` itself (factor 1),
    and the trainer's step alone is the probe's divided by ``clock`` (`anchored_training`; `model`'s refresh costs
    kept): the machine is taken to have sped up or slowed down for the trainer as for the engine.

    Returns:
        (the training model on the profile's clock, clock).

    Raises:
        ValueError: the anchor has no call of one engine alone, or its step is not longer than the export.
    """
    clock = anchored_generation_factor(gen, anchor.calls)
    moved = ProbeAnchor(anchor.step_seconds / clock, anchor.step_tokens, anchor.step_sequences, anchor.calls)
    return anchored_training(model, moved, prompt_tokens_per_prompt), clock


def sharing_rate(demand: np.ndarray, cores: float) -> np.ndarray:
    """Processor-sharing rate of every runnable process at total thread `demand` on `cores`: min(1, cores/demand)
    (1 where nothing runs)."""
    d = np.asarray(demand, np.float64)
    return np.where(d > cores, cores / np.maximum(d, FLOOR_S), 1.0)


def mean_rates(
    calls: np.ndarray,
    steps: np.ndarray,
    *,
    cores: float,
    threads_per_actor: float,
    trainer_threads: float,
    contention: ContentionTable | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean sharing rate over each generation call's and each trainer step's own interval.

    Args:
        calls: [m, 2] (start, end) of every generation call; steps: [k, 2] (start, end) of every trainer step.
        cores, threads_per_actor, trainer_threads: the sharing model (demand per decoding call / running step).
        contention: measured slowdowns instead of processor sharing (then `cores` and the demands are unused).

    Returns:
        (rates of the calls [m], rates of the steps [k]), each in (0, 1]; an interval of zero length gets the
        rate at its start.
    """
    calls, steps = np.asarray(calls, np.float64).reshape(-1, 2), np.asarray(steps, np.float64).reshape(-1, 2)
    cuts = np.unique(np.concatenate([calls.ravel(), steps.ravel()]))
    if cuts.size < 2:
        return np.ones(len(calls)), np.ones(len(steps))
    lo, hi = cuts[:-1], cuts[1:]
    mid = (lo + hi) / 2
    decoding = ((calls[:, :1] <= mid) & (mid < calls[:, 1:])).sum(axis=0)
    training = ((steps[:, :1] <= mid) & (mid < steps[:, 1:])).sum(axis=0)
    if contention is None:
        call_rate = step_rate = sharing_rate(threads_per_actor * decoding + trainer_threads * training, cores)
    else:
        call_slow, step_slow = contention.slowdowns(decoding, training > 0)
        call_rate, step_rate = 1.0 / call_slow, 1.0 / step_slow

    def over(intervals: np.ndarray, rate: np.ndarray) -> np.ndarray:
        if not len(intervals):
            return np.zeros(0)
        cover = np.clip(np.minimum(intervals[:, 1:], hi) - np.maximum(intervals[:, :1], lo), 0.0, None)
        length = cover.sum(axis=1)
        at_start = rate[np.clip(np.searchsorted(lo, intervals[:, 0], side="right") - 1, 0, len(rate) - 1)]
        return np.where(length > 0, (cover * rate).sum(axis=1) / np.maximum(length, FLOOR_S), at_start)

    return over(calls, call_rate), over(steps, step_rate)


def launch_intervals(minibatches: pd.DataFrame, iterations: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(calls [m, 2], steps [k, 2]): the (start, end) seconds of a launch's generation calls and trainer steps on
    the run's clock (one session: a resumed run's later sessions restart it, so only session 0 is used).

    Raises:
        ValueError: a missing column, or non-finite / negative times.
    """
    for name, frame, cols in (("minibatches", minibatches, CALL_COLUMNS), ("iterations", iterations, STEP_COLUMNS)):
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"{name} table lacks columns {missing} (a launch's {name}.parquet has them)")
    minibatches = first_session(minibatches)
    start = minibatches["gen_start_s"].to_numpy(np.float64)
    calls = np.column_stack([start, start + minibatches["gen_s"].to_numpy(np.float64)])
    it = iterations.sort_values("step") if "step" in iterations.columns else iterations
    end = np.cumsum(it["runtime/iteration_time_s"].to_numpy(np.float64))
    steps = np.column_stack([end - it["runtime/train_step_s"].to_numpy(np.float64), end])
    for name, v in (("minibatches", calls), ("iterations", steps)):
        if not np.all(np.isfinite(v)) or np.any(v[:, 1] < v[:, 0]):
            raise ValueError(f"{name} table holds non-finite or negative times")
    return calls, steps


def first_session(minibatches: pd.DataFrame) -> pd.DataFrame:
    """The calls of a launch's first session (a resumed run's later sessions restart the clock)."""
    if "session" not in minibatches.columns:
        return minibatches
    return minibatches[minibatches["session"] == minibatches["session"].min()]


def call_predictions(
    minibatches: pd.DataFrame, gen: GenerationTimeModel, prompt_tokens_per_prompt: float
) -> np.ndarray:
    """The profile fit's seconds (one engine alone) of each call in `minibatches`."""
    prompts = minibatches["prompts"].to_numpy(np.float64)
    return gen.seconds_many(
        prompts,
        minibatches["responses"].to_numpy(np.float64) / np.maximum(prompts, 1.0),
        minibatches["max_length"].to_numpy(np.float64),
        minibatches["tokens"].to_numpy(np.float64),
        prompts * prompt_tokens_per_prompt,
    )


def usable_calls(minibatches: pd.DataFrame) -> np.ndarray:
    """Mask of calls the generation fit can predict: first attempts of whole minibatches (no continued responses,
    whose prompts are longer than the profile's) with prompts and a positive time."""
    ok = (minibatches["prompts"].to_numpy() > 0) & (minibatches["gen_s"].to_numpy(np.float64) > 0)
    if "split_responses" in minibatches.columns:
        ok &= minibatches["split_responses"].fillna(0).to_numpy() == 0
    return np.asarray(ok, bool)


def fit_generation_factor(work: np.ndarray, predicted: np.ndarray) -> float:
    """Least-squares factor f of ``work ~ f x predicted`` through 0 (work: full-speed seconds of each call)."""
    denom = float(np.sum(predicted**2))
    if denom <= 0:
        raise ValueError("no generation call with a positive predicted time")
    return float(np.sum(work * predicted) / denom)


def mdape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Median absolute percentage error (a fraction) of `predicted` against `measured` (> 0)."""
    return float(np.median(np.abs(predicted - measured) / np.maximum(measured, FLOOR_S)))


def score_trainer_threads(
    calls: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    *,
    cores: float,
    threads_per_actor: float,
    trainer_threads: float,
    contention: ContentionTable | None = None,
    factor: float | None = None,
) -> tuple[float, float, list[np.ndarray]]:
    """One candidate of `fit_cpu_sharing`: (generation factor, its error, the steps' mean rates per launch).

    Args:
        calls: per launch (call intervals [m, 2], usable mask [m], predicted seconds [m], step intervals [k, 2]).
        contention: measured slowdowns instead of processor sharing (`mean_rates`).
        factor: the generation factor to score (None: the least-squares one of these calls).
    """
    work, pred, measured, rates_each, step_rates = [], [], [], [], []
    for intervals, usable, predicted, steps in calls:
        call_rate, step_rate = mean_rates(
            intervals,
            steps,
            cores=cores,
            threads_per_actor=threads_per_actor,
            trainer_threads=trainer_threads,
            contention=contention,
        )
        seconds = intervals[:, 1] - intervals[:, 0]
        work.append((seconds * call_rate)[usable])
        pred.append(predicted[usable])
        measured.append(seconds[usable])
        rates_each.append(call_rate[usable])
        step_rates.append(step_rate)
    w, p, m, r = (np.concatenate(a) for a in (work, pred, measured, rates_each))
    if factor is None:
        factor = fit_generation_factor(w, p)
    return factor, mdape(factor * p / r, m), step_rates


def training_mdape(
    frames: Sequence[pd.DataFrame],
    step_rates: Sequence[np.ndarray],
    train: TrainingTimeModel,
    n_samples: Sequence[int],
) -> float:
    """MdAPE of the launches' ``train/t_train_s`` (trailing means) against `train`'s full-speed step times divided
    by each step's mean sharing rate, as trailing means of the same window."""
    from asp.sim.timemodel import T_TRAIN_WINDOW

    measured, predicted = [], []
    for frame, rate, count in zip(frames, step_rates, n_samples, strict=True):
        full = np.asarray(
            [
                train.step_seconds(tok, prompts * count)
                for tok, prompts in zip(frame["train/response_tokens"], frame["train/prompts"], strict=True)
            ]
        )
        predicted.append(pd.Series(full / rate).rolling(T_TRAIN_WINDOW, min_periods=1).mean().to_numpy())
        measured.append(frame["train/t_train_s"].to_numpy(np.float64))
    return mdape(np.concatenate(predicted), np.concatenate(measured))


def fit_cpu_sharing(
    minibatches: Sequence[pd.DataFrame],
    iterations: Sequence[pd.DataFrame],
    gen: GenerationTimeModel,
    prompt_tokens_per_prompt: float,
    *,
    cores: float,
    threads_per_actor: float,
    n_samples: Sequence[int],
    grid: Sequence[float] = TRAINER_THREADS_GRID,
    contention: ContentionTable | None = None,
    anchor: ProbeAnchor | None = None,
) -> tuple[CpuSharing, TrainingTimeModel, dict[str, float]]:
    """Fit the CPU sharing of one or more launches (their minibatches and iterations tables, paired) and the
    full-speed training-time model under it (see the module docstring).

    Args:
        minibatches, iterations: one table each per launch (``outputs/launch/*.parquet``), in the same order.
        gen: the profile's generation-time fit (one engine alone); prompt_tokens_per_prompt: the profile's mean.
        cores, threads_per_actor: as the simulator's `Resources`; n_samples: samples per prompt of each launch.
        grid: candidate ``trainer_threads``.
        contention: measured slowdowns (`ContentionTable`): then no trainer demand is fitted (the report's
            ``trainer_threads`` is 0 and ``contention`` 1) and only the generation factor and training model are.
        anchor: with `contention`, what the probe timed alone: full speed is that, not a fit. The training model
            is anchored at the probe's step (`anchored_training`; the launch gives only its refresh costs) and the
            generation factor at its calls of one engine alone (`anchored_generation_factor`; from the launch when
            the probe has none). The report's errors are then the launch's under these terms (a check, not a fit).

    Returns:
        (sharing, training model, report): the report has ``trainer_threads``, ``generation_factor``,
        ``mdape_generation`` and ``mdape_training`` (of the measured call and step times, predicted back through
        the measured contention), ``trainer_threads_near_min`` / ``_near_max`` (the candidates within one point
        of the best summed error: a wide range means the launch cannot tell the trainer's demand from the
        generation factor, as when every call overlapped a trainer step), ``calls``, ``steps``, the training
        fit's values, and with an anchor ``anchored`` 1 and ``generation_anchored``.

    Raises:
        ValueError: unpaired tables, a missing column, fewer than 3 usable calls, bad values.
    """
    from asp.sim.timemodel import fit_training_model

    if not minibatches or len(minibatches) != len(iterations) or len(n_samples) != len(iterations):
        raise ValueError("need one minibatches table, one iterations table and one n_samples per launch")
    if not cores > 0 or not threads_per_actor > 0 or not grid:
        raise ValueError(f"cores and threads_per_actor must be > 0 and a grid given, got {cores}, {threads_per_actor}")
    launches = []
    for mb, it in zip(minibatches, iterations, strict=True):
        it = it.sort_values("step") if "step" in it.columns else it
        table = first_session(mb)
        calls, steps = launch_intervals(table, it)
        usable = usable_calls(table)
        launches.append((calls, usable, call_predictions(table, gen, prompt_tokens_per_prompt), steps, it))
    if sum(int(u.sum()) for _, u, _, _, _ in launches) < 3:
        raise ValueError("need at least 3 generation calls without continued responses")
    frames = [it for *_, it in launches]
    counts = {
        "calls": float(sum(int(u.sum()) for _, u, _, _, _ in launches)),
        "steps": float(sum(len(s) for _, _, _, s, _ in launches)),
    }
    if contention is not None and anchor is not None:
        return _fit_anchored(launches, frames, gen, prompt_tokens_per_prompt, n_samples, contention, anchor, counts)
    if contention is not None:
        grid = (0.0,)
    best: tuple[float, ...] | None = None
    scores: list[tuple[float, float]] = []  # (trainer threads, summed error)
    for threads in grid:
        factor, gen_err, step_rates = score_trainer_threads(
            [(c, u, p, s) for c, u, p, s, _ in launches],
            cores=cores,
            threads_per_actor=threads_per_actor,
            trainer_threads=float(threads),
            contention=contention,
        )
        train, _ = fit_training_model(
            frames, n_samples=list(n_samples), rates=step_rates, prompt_tokens_per_sample=prompt_tokens_per_prompt
        )
        train_err = training_mdape(frames, step_rates, train, n_samples)
        scores.append((float(threads), gen_err + train_err))
        if best is None or gen_err + train_err < best[0] + best[1] - 1e-12:
            best = (gen_err, train_err, float(threads), factor)
            best_train = train
    assert best is not None
    gen_err, train_err, threads, factor = best
    near = [t for t, err in scores if err <= gen_err + train_err + NEAR_BEST]
    report = {
        "trainer_threads": threads,
        "trainer_threads_near_min": min(near),
        "trainer_threads_near_max": max(near),
        "generation_factor": factor,
        "mdape_generation": gen_err,
        "mdape_training": train_err,
        **counts,
        "contention": float(contention is not None),
    }
    report.update({f"training_{k}": float(v) for k, v in best_train.to_dict().items()})
    return CpuSharing(threads, factor), best_train, report


def _fit_anchored(
    launches: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, pd.DataFrame]],
    frames: list[pd.DataFrame],
    gen: GenerationTimeModel,
    prompt_tokens_per_prompt: float,
    n_samples: Sequence[int],
    contention: ContentionTable,
    anchor: ProbeAnchor,
    counts: dict[str, float],
) -> tuple[CpuSharing, TrainingTimeModel, dict[str, float]]:
    """`fit_cpu_sharing` with a measured table and the probe's processes timed alone (see there)."""
    from asp.sim.timemodel import fit_training_model

    anchored = anchored_generation_factor(gen, anchor.calls) if anchor.calls else None  # else the launch's
    factor, gen_err, step_rates = score_trainer_threads(
        [(c, u, p, s) for c, u, p, s, _ in launches],
        cores=1.0,
        threads_per_actor=1.0,
        trainer_threads=0.0,
        contention=contention,
        factor=anchored,
    )
    refresh, _ = fit_training_model(
        frames, n_samples=list(n_samples), rates=step_rates, prompt_tokens_per_sample=prompt_tokens_per_prompt
    )
    train = anchored_training(refresh, anchor, prompt_tokens_per_prompt)
    report = {
        "trainer_threads": 0.0,
        "trainer_threads_near_min": 0.0,
        "trainer_threads_near_max": 0.0,
        "generation_factor": factor,
        "mdape_generation": gen_err,
        "mdape_training": training_mdape(frames, step_rates, train, n_samples),
        **counts,
        "contention": 1.0,
        "anchored": 1.0,
        "generation_anchored": float(bool(anchor.calls)),
    }
    report.update({f"training_{k}": float(v) for k, v in train.to_dict().items()})
    return CpuSharing(0.0, factor), train, report
