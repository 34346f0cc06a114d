"""`simulate` stage: the run that `launch` would make, predicted on a simulated clock, for C0-C4 side by side.

Fits three models from what the pipeline already measured, then simulates `runtime:` (mode async or sync, layout,
batch, q_max, lag bound, iterations) with `asp.sim.engine.simulate`, which drives the runtime's own Control Unit
core (`asp.control`):

* generation time per minibatch (`asp.sim.timemodel`): fitted on metrics/profile_timings.csv, the profile
  stage's timed minibatches; its held-out fit (K-fold R², median absolute percentage error) is reported;
* realized response lengths (`asp.sim.lengths`, ``simulate.lengths``): built from the held-out profiled
  prompts against their cross-fitted calibrated predictions (out of sample), then sampled for every scheduled
  prompt (the same lengths in every condition); the default resamples the samples of the held-out prompts
  with the nearest calibrated length, rescaled;
* training time: ``runtime.trainer.step_s`` / ``refresh_delay_s`` for the simulated trainer, the
  ``simulate.training`` params for GRPO (`asp simulate fit-training` fits them from a launch);
* CPU sharing: the actors share ``simulate.cores`` by processor sharing, and so does the GRPO trainer's step
  where ``simulate.trainer_threads`` > 0 (`asp.sim.sharing`); the generation times are the profile fit (one
  engine alone) x ``simulate.sharing_factor``. `asp simulate fit-training` fits all three terms from a launch's
  own calls and steps (defaults: 1 and 0, no trainer among the sharers). Under ``simulate.sharing: measured`` with
  ``simulate.full_speed: auto`` and a probe that timed one engine's calls alone, full speed is this sitting's
  instead: generation is the profile fit itself, and a GRPO trainer's step is the one the trainer_alone stage timed
  alone (metrics/trainer_alone.json, ``simulate/gen_fit/trainer_alone_s``); without that file, the probe's step
  scaled by how much faster or slower the profile's sitting ran the probe's calls (``simulate/gen_fit/probe_clock``;
  `asp.sim.sharing.on_profile_clock`). The profile and the trainer are re-timed with each pipeline run, the probe
  (its slowdowns) is not.
C4 is the schedule stage's own schedule (checked against the predictions); C0-C3 are rebuilt as `launch` does.

Writes metrics/simulate.json (``simulate/<condition>/...`` and the fits), outputs/simulate/ (models.json,
iterations.parquet) and plots/simulate_timeline.png. `simulate.enabled: false` writes only the flag; so does a
profile read from a lengths file (`profile.source: file`: no generation was timed), saying why (docs/lengths.md).

Run: `asp stage simulate` (what `dvc repro simulate` calls); `asp simulate` runs the same with overrides.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
import yaml

from asp.config import Params, migrate_params, read_yaml, validate_params
from asp.control.plan import WorkPlan
from asp.errors import UserError
from asp.io import atomic_path, read_json, write_json, write_parquet
from asp.plots import save_figure
from asp.plots.sim import timeline_figure
from asp.predictor.calibration import CALIBRATION_FOLDS, cross_fit_calibration
from asp.runtime.config import RuntimeConfig
from asp.sim.engine import Resources, Workload, simulate
from asp.sim.inputs import visits_needed
from asp.sim.lengths import fit_empirical_length_model, fit_length_model
from asp.sim.presets import FIT, SENSITIVITY_GRID, get_preset, scaled_models
from asp.sim.sharing import (
    PROBE_LEVEL,
    SITTING_WIDTH,
    TRAINER_THREADS_GRID,
    ContentionTable,
    CpuSharing,
    ProbeAnchor,
    anchored_generation_factor,
    anchored_training,
    bound_tables,
    fit_cpu_sharing,
    on_profile_clock,
    probe_clock_doubtful,
    probe_intervals,
)
from asp.sim.timemodel import TrainingTimeModel, drift_doubtful, fit_generation_model, shared
from asp.steps.loaders import load_calibration
from asp.steps.paths import SimulatePaths as Paths
from asp.steps.scheduling import schedule_predictions
from asp.tracking import Tracker

if TYPE_CHECKING:
    from asp.control.settings import ControlSettings
    from asp.predictor.calibration import CalibrationMap
    from asp.sim.lengths import EmpiricalLengthModel, LengthModel
    from asp.sim.presets import TimeModelPreset

VISIT_STREAM = 0x5EED  # the random stream of the prompts' later visits (`workload`), apart from their first
# the Table 4(b) columns and the simulator's own, as reported per condition
REPORTED = (
    "runtime/summary/mean_iteration_time_s",
    "runtime/summary/mean_iteration_time_s_excl_first",
    "runtime/summary/generation_time_mean_s",
    "runtime/summary/train_step_mean_s",
    "runtime/summary/iteration_time_trend",
    "runtime/summary/queue_std_samples",
    "runtime/summary/queue_max_samples",
    "runtime/summary/generation_time_std_s",
    "runtime/summary/padding_rate_mean",
    "runtime/summary/depth_at_arrival_batches_mean",
    "runtime/summary/tokens_per_s",
    "runtime/summary/wall_s",
    "runtime/summary/minibatches",
    "sim/policy_lag_mean",
    "sim/policy_lag_max",
    "sim/d_off_estimate",
    "sim/duty_cycle",
    "sim/generation_utilization",
    "sim/training_utilization",
    "sim/events",
)


@dataclass(frozen=True)
class Models:
    """The fitted models and their reports."""

    gen: Any
    gen_report: dict[str, float]
    lengths: Any
    length_report: dict[str, float]
    train: Any
    prompt_tokens: float  # mean prompt tokens per prompt (profiled minibatches)


def _need(path: Path, stage: str) -> Path:
    if not path.is_file():
        raise UserError(f"{path}: missing. Run the {stage} stage first (`dvc repro {stage}`).")
    return path


def generation_form(params: Params) -> Literal["static", "continuous"]:
    """static for the hf engine (static batches), continuous for vLLM, unless `simulate.generation_form` says."""
    form = params.simulate.generation_form
    if form == "static" or form == "continuous":
        return form
    return "continuous" if params.profile.engine.kind == "vllm" else "static"


def _on_gpu(device: str) -> bool:
    return device.startswith("cuda")


def gpu_gaps(params: Params) -> list[str]:
    """What the simulator still lacks to model this run's GPUs: one line per missing piece, [] when none.

    The simulator's models are measurements: generation times come from the profile's timed minibatches, the
    Training Unit's times from `simulate.training`, and `simulate.cores` models CPU cores the actors share. On
    GPUs (vLLM actors, a CUDA Training Unit) each must come from GPUs, or the stage would print numbers from the
    wrong machine.
    """
    rt, sim, gaps = params.runtime, params.simulate, []
    if rt.engine.kind != params.profile.engine.kind:
        gaps.append(
            f"profile.engine.kind is {params.profile.engine.kind!r} but runtime.engine.kind is {rt.engine.kind!r}: "
            "the generation-time model is fitted on the profile's timings, so profile with the engine launch uses."
        )
    if rt.engine.kind == "vllm" and generation_form(params) != "continuous":
        gaps.append(
            "simulate.generation_form is 'static' but the actors are vLLM engines (continuous batching): set it "
            "to 'continuous' or 'auto'."
        )
    if _on_gpu(rt.engine.device) and sim.cores is not None:
        gaps.append(
            f"simulate.cores is {sim.cores:g} (CPU cores shared by the actors) but the actors run on "
            f"{rt.engine.device}, a device each: set simulate.cores: null."
        )
    if rt.trainer.kind == "grpo" and _on_gpu(rt.grpo.device) and sim.training.measured_on != "cuda":
        gaps.append(
            f"simulate.training holds times measured on {sim.training.measured_on} (the defaults are the CPU "
            "demo's fit) but the Training Unit runs on GPUs: after a first launch, run `asp simulate fit-training` "
            "and put its simulate.training block into your params."
        )
    return gaps


def numbered(gaps: list[str]) -> str:
    """`gpu_gaps` as one line: "(1) ... (2) ..."."""
    return " ".join(f"({i}) {gap}" for i, gap in enumerate(gaps, 1))


def check_gpu_gaps(params: Params) -> None:
    """`UserError` listing `gpu_gaps` (the stage, `asp simulate` and `asp plan layout` call this first)."""
    gaps = gpu_gaps(params)
    if gaps:
        raise UserError(
            "the simulator cannot model this GPU run yet; it would print numbers measured on another machine. "
            "Missing: " + numbered(gaps)
        )


def training_model(params: Params) -> TrainingTimeModel:
    """The Training Unit's times: the simulated trainer's fixed ones, or `simulate.training` for GRPO."""
    rt = params.runtime
    if rt.trainer.kind == "simulated":
        return TrainingTimeModel.simulated(rt.trainer.step_s, rt.trainer.refresh_delay_s)
    return TrainingTimeModel(**params.simulate.training.model_dump(exclude={"measured_on"}))


def untimed(paths: Paths) -> str:
    """Why there are no generation times to fit ('' when there are): the profile was read from a lengths file
    (`profile.source: file`), so the timings table holds its header only."""
    if paths.timings.is_file() and pd.read_csv(paths.timings).empty:
        return (
            f"no generated profile: {paths.timings} holds no timed minibatch (profile.source: file reads lengths, it "
            "times no generation), and the simulator's generation-time model is fitted on those timings. Profile "
            "with profile.source: generate to simulate, or set simulate.enabled: false to say so in params."
        )
    return ""


def fit_models(params: Params, paths: Paths) -> Models:
    """Fit the generation-time and length models (see the module docstring)."""
    preset = time_model_preset(params)
    if preset is None:
        check_gpu_gaps(params)
    if why := untimed(paths):
        raise UserError(f"cannot simulate: {why}")
    timings = pd.read_csv(_need(paths.timings, "profile"))
    gen_report: dict[str, float] = {}
    anchor: ProbeAnchor | None = None  # full speed on the profile's clock (simulate.full_speed: auto)
    if preset is not None:
        gen = preset.gen
    else:
        try:
            gen, gen_report = fit_generation_model(
                timings, generation_form(params), folds=params.simulate.folds, seed=params.common.seed
            )
        except ValueError as exc:
            raise UserError(f"{paths.timings}: cannot fit a generation-time model: {exc}") from None
        anchor = profile_clock_anchor(params, paths)
        if anchor is None and params.simulate.sharing_factor != 1.0:
            gen = shared(gen, params.simulate.sharing_factor)
    preds = pd.read_parquet(_need(paths.predictions, "predict"), columns=["prompt_id", "predicted_length"])
    heldout = pd.read_parquet(_need(paths.heldout, "prepare"), columns=["prompt_id"])
    samples = pd.read_parquet(_need(paths.samples, "profile"), columns=["prompt_id", "length"])
    samples = samples[samples["prompt_id"].isin(heldout["prompt_id"])]
    joined = preds[preds["prompt_id"].isin(samples["prompt_id"])].reset_index(drop=True)
    if len(joined) < CALIBRATION_FOLDS * 2:
        raise UserError(
            f"{paths.predictions}: only {len(joined)} held-out prompts have predictions and profiled lengths; the "
            "length model needs at least 10. Raise prepare.heldout_prompts."
        )
    true_mean = samples.groupby("prompt_id")["length"].mean().reindex(joined["prompt_id"]).to_numpy(np.float64)
    predicted = joined["predicted_length"].to_numpy(np.float64)
    calibrated = cross_fit_calibration(predicted, true_mean, CALIBRATION_FOLDS)
    row = pd.Series(np.arange(len(joined)), index=joined["prompt_id"])
    sample_lengths, index = samples["length"].to_numpy(np.int64), row.loc[samples["prompt_id"]].to_numpy()
    cap = params.profile.max_new_tokens
    lengths: LengthModel | EmpiricalLengthModel
    if params.simulate.lengths == "empirical":
        lengths, length_report = fit_empirical_length_model(calibrated, sample_lengths, index, cap)
    else:
        lengths, length_report = fit_length_model(predicted, calibrated, sample_lengths, index, cap)
    prompt_tokens = mean_prompt_tokens(timings)
    train = preset.train if preset is not None else training_model(params)
    if anchor is not None:
        alone = trainer_alone_anchor(params, paths)
        try:  # how much slower the probe's sitting ran the same engine; the trainer's step moved by it unless it was
            # timed in this sitting (the simulated trainer computes nothing: only generation is on the profile's clock)
            if params.runtime.trainer.kind == "grpo" and alone is None:
                train, clock = on_profile_clock(gen, train, anchor, prompt_tokens)
            else:
                clock = anchored_generation_factor(gen, anchor.calls)
        except ValueError as exc:
            raise UserError(f"{paths.sharing_probe}: {exc}. Re-run `asp simulate probe-sharing`.") from None
        gen_report["probe_clock"] = clock
        if alone is not None:  # the step timed alone in this sitting: its full speed as timed, no clock to move
            try:
                train = anchored_training(train, alone, prompt_tokens)
            except ValueError as exc:
                raise UserError(f"{paths.trainer_alone}: {exc}. Re-run `dvc repro trainer_alone`.") from None
            gen_report["trainer_alone_s"] = alone.step_seconds
    return Models(gen, gen_report, lengths, length_report, train, prompt_tokens)


def profile_clock_anchor(params: Params, paths: Paths) -> ProbeAnchor | None:
    """The sharing probe's anchor when ``simulate.full_speed: auto`` puts full speed on the profile's clock (the
    probe timed one engine's calls and the trainer's step alone; `asp.sim.sharing.on_profile_clock`), else None
    (full speed from sharing_factor and simulate.training)."""
    if params.simulate.full_speed != "auto" or (probe := sharing_probe(params, paths)) is None:
        return None
    anchor = ProbeAnchor.from_probe(probe)
    return anchor if anchor is not None and anchor.calls else None


def trainer_alone_anchor(params: Params, paths: Paths) -> ProbeAnchor | None:
    """The GRPO trainer's step timed alone in the pipeline's sitting (the trainer_alone stage's metrics), or None:
    not a GRPO trainer, no such file (a pipeline before that stage, or a test's), or nothing timed there."""
    if params.runtime.trainer.kind != "grpo" or not paths.trainer_alone.is_file():
        return None
    return ProbeAnchor.from_trainer_alone(read_json(paths.trainer_alone))


def mean_prompt_tokens(timings: pd.DataFrame) -> float:
    """The profile's mean prompt tokens per prompt (metrics/profile_timings.csv)."""
    return float(timings["prompt_tokens"].sum() / max(int(timings["num_prompts"].sum()), 1))


def fit_launch_sharing(
    params: Params,
    paths: Paths,
    minibatches: list[pd.DataFrame],
    iterations: list[pd.DataFrame],
    n_samples: list[int],
    fixed_trainer_threads: float | None = None,
    anchored: bool = True,
) -> tuple[CpuSharing, TrainingTimeModel, dict[str, float]]:
    """`asp.sim.sharing.fit_cpu_sharing` of launches' tables against the profile's generation fit (one engine
    alone, no sharing factor), on `simulate.cores` shared by actors of `runtime.engine.num_threads`: what
    `asp simulate fit-training` prints. `fixed_trainer_threads` fixes the trainer's demand instead of fitting it (the
    generation factor and training times are still fitted under it). Under ``simulate.sharing: measured`` with a
    probe that timed the trainer's step and one engine's calls alone, full speed is those measurements and the
    launch gives only the refresh costs (and its own errors under the result); ``anchored=False`` fits full speed
    on the launches under the probe's slowdowns instead. Raises ValueError from the fits (bad tables, too few calls
    or timings)."""
    timings = pd.read_csv(paths.timings)
    gen, _ = fit_generation_model(
        timings, generation_form(params), folds=params.simulate.folds, seed=params.common.seed
    )
    probe = sharing_probe(params, paths)
    return fit_cpu_sharing(
        minibatches,
        iterations,
        gen,
        mean_prompt_tokens(timings),
        cores=params.simulate.cores or 1.0,
        threads_per_actor=params.runtime.engine.num_threads or 1,
        n_samples=n_samples,
        grid=TRAINER_THREADS_GRID if fixed_trainer_threads is None else (fixed_trainer_threads,),
        contention=probe_table(probe, paths) if probe is not None else None,
        anchor=ProbeAnchor.from_probe(probe) if probe is not None and anchored else None,
    )


def time_model_preset(params: Params) -> TimeModelPreset | None:
    """The `simulate.time_model` preset (published GPU/NPU times), or None for the default fit."""
    name = params.simulate.time_model
    return None if name == FIT else get_preset(name)


@functools.lru_cache(maxsize=8)
def _read_once(path: str, mtime_ns: int, size: int) -> str:
    """The text of `path` as it is at (`mtime_ns`, `size`): one simulation reads the probe once, however many of its
    parts (the table, the anchor, the warnings, the range) ask for it, and a rewritten probe is read again."""
    return Path(path).read_text()


def sharing_probe(params: Params, paths: Paths) -> dict[str, Any] | None:
    """The sharing probe's record (`paths.sharing_probe`) under ``simulate.sharing: measured`` on shared cores (no
    preset), else None.

    Raises:
        UserError: the probe file is missing or not JSON.
    """
    if params.simulate.sharing != "measured" or params.simulate.cores is None or time_model_preset(params):
        return None
    path = paths.sharing_probe
    if not path.is_file():
        raise UserError(
            f"{path}: not found. simulate.sharing: measured needs the sharing probe: run `asp simulate "
            "probe-sharing` on the machine the launch runs on, or set simulate.sharing: processor."
        )
    stat = path.stat()
    try:
        data = json.loads(_read_once(str(path.resolve()), stat.st_mtime_ns, stat.st_size))
    except ValueError as exc:
        raise UserError(f"{path}: not JSON ({exc}). Re-run `asp simulate probe-sharing`.") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a sharing probe. Re-run `asp simulate probe-sharing`.")
    return data


def contention_table(params: Params, paths: Paths) -> ContentionTable | None:
    """The measured slowdowns of the sharing probe (`sharing_probe`), else None.

    Raises:
        UserError: the probe file is missing or not a sharing probe.
    """
    data = sharing_probe(params, paths)
    return probe_table(data, paths) if data is not None else None


def probe_table(data: dict[str, Any], paths: Paths) -> ContentionTable:
    """The `ContentionTable` of a sharing probe's record read from `paths.sharing_probe`.

    Raises:
        UserError: the record is not a sharing probe.
    """
    try:
        return ContentionTable.from_dict(data)
    except (ValueError, TypeError, AttributeError) as exc:
        raise UserError(f"{paths.sharing_probe}: {exc}. Re-run `asp simulate probe-sharing`.") from None


def resources(params: Params, paths: Paths) -> Resources:
    """Shared CPU cores as `simulate.cores` says, the GRPO trainer among the sharers per
    `simulate.trainer_threads` (the simulated trainer computes nothing: never), at the slowdowns of the sharing
    probe under ``simulate.sharing: measured`` (`contention_table`); a device per actor (no sharing) under a
    GPU/NPU preset."""
    cores = None if time_model_preset(params) is not None else params.simulate.cores
    grpo = params.runtime.trainer.kind == "grpo"
    trainer = params.simulate.trainer_threads if grpo and cores is not None else None
    return Resources(
        cores=cores,
        threads_per_actor=params.runtime.engine.num_threads or 1,
        trainer_threads=trainer,
        contention=contention_table(params, paths),
    )


def condition_plans(params: Params, paths: Paths, preds: pd.DataFrame, calibration: Any) -> dict[str, Any]:
    """The work plan of every simulated condition: C4 = the schedule stage's output, C0-C3 rebuilt."""
    plans: dict[str, Any] = {}
    for cond in params.simulate.conditions:
        if cond == "C4":
            plan = WorkPlan.from_frame(pd.read_parquet(_need(paths.schedule, "schedule")))
            scheduled, predicted = set(plan.prompt_ids()), set(preds["prompt_id"])
            if scheduled != predicted:
                odd = sorted(scheduled ^ predicted, key=str)[:3]
                raise UserError(
                    f"{paths.schedule}: the schedule does not match {paths.predictions} ({len(scheduled)} scheduled "
                    f"vs {len(predicted)} predicted prompts; e.g. {odd} are in only one). Re-run the schedule "
                    "stage (`dvc repro schedule`)."
                )
            plans[cond] = plan
            continue
        plans[cond] = WorkPlan.from_schedule(schedule_predictions(params, preds, calibration, cond))
    return plans


def workload(params: Params, models: Models, preds: pd.DataFrame, calibration: CalibrationMap | None) -> Workload:
    """Realized lengths of every predicted prompt at each of its visits (`visits`), sampled once (seeded) so every
    condition sees the same. A later visit keeps the prompt's own level and draws its samples again
    (`sample_visits`): a policy sampling a prompt again does not repeat its lengths, which a history-aware pass
    (``runtime.history``) would otherwise know exactly."""
    predicted = preds["predicted_length"].to_numpy(np.float64)
    expected = np.asarray(calibration(predicted) if calibration is not None else predicted, np.float64)
    rng, later = np.random.default_rng(params.common.seed), np.random.default_rng([params.common.seed, VISIT_STREAM])
    n = params.runtime.sampling.n_samples
    drawn = models.lengths.sample_visits(expected, n, visits(params, len(preds)), rng, later)
    tokens = np.full(len(preds), round(models.prompt_tokens), np.int64)
    return Workload.from_arrays(
        preds["prompt_id"].tolist(), drawn[0], tokens, params.runtime.sampling.max_new_tokens, revisits=drawn[1:]
    )


def visits(params: Params, prompts: int) -> int:
    """How many visits of each of `prompts` prompts the simulated run draws (`asp.sim.inputs.visits_needed`: its
    trainer steps of ``runtime.global_batch_prompts``)."""
    steps = params.simulate.iterations or params.runtime.iterations
    return visits_needed(steps, params.runtime.global_batch_prompts, prompts)


def control_settings(params: Params, condition: str) -> ControlSettings:
    """The simulated run's `asp.control.ControlSettings` for `condition`: ``runtime:`` (``runtime.mode`` included:
    sync simulates the synchronous baseline) with ``simulate.iterations`` when set, and ``common.seed``; history-aware
    passes (``runtime.history``) for C4 only, as in a launch."""
    runtime = dict(params.runtime)
    if params.simulate.iterations is not None:
        runtime["iterations"] = params.simulate.iterations
    runtime["condition"] = condition
    return RuntimeConfig(**runtime, seed=params.common.seed, schedule=params.schedule).control_settings()


def simulate_conditions(params: Params, paths: Paths, models: Models) -> dict[str, Any]:
    """condition -> `SimResult` of `runtime:` over that condition's plan."""
    preds = pd.read_parquet(_need(paths.predictions, "predict"), columns=["prompt_id", "predicted_length"])
    calibration = load_calibration(paths.calibration)
    plans = condition_plans(params, paths, preds, calibration)
    load = workload(params, models, preds, calibration)
    res = resources(params, paths)
    results = {}
    for cond, plan in plans.items():
        results[cond] = simulate(plan, load, models.gen, models.train, control_settings(params, cond), res)
        print(f"[simulate] {cond}: {results[cond].metrics[REPORTED[0]]:.3f} s per iteration", file=sys.stderr)
    return results


Ranges = dict[str, dict[str, tuple[float, float]]]  # condition -> REPORTED key -> (min, max)


def _ranges(
    params: Params,
    paths: Paths,
    models: Models,
    variants: Iterable[tuple[Any, Any, Resources]],
    simulated: dict[str, Any] | None = None,
) -> Ranges:
    """condition -> metric (a ``REPORTED`` key) -> (min, max) of the runs simulated under each (generation model,
    training model, resources) of `variants`, the plans and realized lengths as `simulate_conditions`', and of the
    runs already `simulated` (condition -> `SimResult`), which count without being simulated again."""
    preds = pd.read_parquet(_need(paths.predictions, "predict"), columns=["prompt_id", "predicted_length"])
    calibration = load_calibration(paths.calibration)
    plans = condition_plans(params, paths, preds, calibration)
    load = workload(params, models, preds, calibration)
    done = simulated or {}
    values = {c: {k: [float(done[c].metrics[k])] if c in done else [] for k in REPORTED} for c in plans}
    for gen, train, res in variants:
        for cond, plan in plans.items():
            metrics = simulate(plan, load, gen, train, control_settings(params, cond), res).metrics
            for key in REPORTED:
                values[cond][key].append(float(metrics[key]))
    return {c: {k: (min(v), max(v)) for k, v in per.items()} for c, per in values.items()}


def sensitivity_ranges(params: Params, paths: Paths, models: Models) -> Ranges:
    """The (min, max) of every reported metric over `asp.sim.presets.SENSITIVITY_GRID`: the time model's decode,
    trainer and reload costs scaled over their plausible range, everything else as simulated."""
    res = resources(params, paths)
    grid = [(*scaled_models(models.gen, models.train, scale), res) for scale in SENSITIVITY_GRID]
    return _ranges(params, paths, models, grid)


def probe_ranges(params: Params, paths: Paths, models: Models, results: dict[str, Any]) -> Ranges | None:
    """The (min, max) of every reported metric with the sharing probe's slowdowns at their value (`results`, the
    `simulate_conditions` of the same params and models) and at both ends of the range another sitting's probe falls
    in 9 times in 10 (`asp.sim.sharing.probe_intervals` widened by `SITTING_WIDTH`, `bound_tables`): how far the
    probe's spread moves the simulated run. None without a probe in use, or with one that kept no per-round ratios.

    Raises:
        UserError: the probe's per-round ratios are malformed.
    """
    res = resources(params, paths)
    if res.contention is None:
        return None
    intervals = _probe_intervals(params, paths, SITTING_WIDTH)
    if intervals is None:
        return None
    low, high = bound_tables(res.contention, intervals)
    variants = [(models.gen, models.train, replace(res, contention=t)) for t in (low, high)]
    return _ranges(params, paths, models, variants, results)


def _probe_intervals(
    params: Params, paths: Paths, widen: float = 1.0
) -> dict[tuple[int, bool, str], tuple[float, float, float]] | None:
    """`asp.sim.sharing.probe_intervals` of the probe in use, widened by `widen` (None without a probe or without
    per-round ratios).

    Raises:
        UserError: the per-round ratios are malformed.
    """
    probe = sharing_probe(params, paths)
    try:
        return probe_intervals(probe, widen=widen) if probe is not None else None
    except ValueError as exc:
        raise UserError(f"{paths.sharing_probe}: {exc}. Re-run `asp simulate probe-sharing`.") from None


def run_metrics(models: Models, results: dict[str, Any], probe: Ranges | None = None) -> dict[str, Any]:
    """The stage's metrics: fits, then ``simulate/<condition>/<name>`` for the reported columns, and with `probe`
    (`probe_ranges`) the mean iteration time's ends over the probe's intervals (``..._probe_low``, ``_probe_high``)."""
    metrics: dict[str, Any] = {"simulate/enabled": 1}
    metrics.update({f"simulate/gen_fit/{k}": float(v) for k, v in models.gen_report.items()})
    metrics.update({f"simulate/length_model/{k}": float(v) for k, v in models.length_report.items()})
    for cond, result in results.items():
        for key in REPORTED:
            metrics[f"simulate/{cond}/{key.split('/')[-1]}"] = float(result.metrics[key])
        if probe is not None:
            low, high = probe[cond][REPORTED[0]]
            name = f"simulate/{cond}/{REPORTED[0].split('/')[-1]}"
            metrics[f"{name}_probe_low"], metrics[f"{name}_probe_high"] = float(low), float(high)
    return metrics


def save_outputs(models: Models, results: dict[str, Any], out_dir: Path) -> None:
    """models.json (the fitted models) and iterations.parquet (every simulated step), replaced together."""
    rows = [{"condition": c, **it} for c, r in results.items() for it in r.iterations]
    frame = pd.DataFrame(rows)
    frame = frame[[c for c in frame.columns if "/actor" not in c and "/gu" not in c]]  # keep it small
    with atomic_path(out_dir) as out:
        out.mkdir(parents=True)
        write_json(
            {
                "generation": models.gen.to_dict(),
                "lengths": models.lengths.to_dict(),
                "training": models.train.to_dict(),
                "prompt_tokens": models.prompt_tokens,
            },
            out / "models.json",
        )
        write_parquet(frame, out / "iterations.parquet")


PROBE_SPREAD_WARN = 0.10  # a slowdown of the probe uncertain by more than this either way (`probe_spread_warning`)


def drift_warning(gen_report: dict[str, float], timings: Path) -> str | None:
    """A warning when the profile's timings drifted (`asp.sim.timemodel.speed_drift` above `DRIFT_WARN`), else
    None: the generation-time fit's shape is then partly the machine's drift. Only a monotone drift shows here; a
    profile timed on an unsteady machine can fit poorly with little drift (its held-out R² says so)."""
    drift = gen_report.get("speed_drift", 0.0)
    if not drift_doubtful(drift):
        return None
    return (
        f"warning: {timings}: the machine's speed moved by {100 * drift:.0f} % while the profile was timed "
        f"(the fit's measured / predicted time, median over each fifth of the minibatches in the order they ran); "
        "the generation-time fit carries that drift. Re-time it on an idle machine: dvc repro -f -s profile."
    )


def probe_clock_warning(gen_report: dict[str, float], trainer: str, probe: Path) -> str | None:
    """A warning when the probe's calls of one engine alone ran too far from the profile's fit (``probe_clock``,
    `asp.sim.sharing.on_profile_clock`) where that moves a simulated time (`asp.sim.sharing.probe_clock_doubtful`),
    else None. Two timings of the same engine a sitting apart differ by a few per cent; more says the two did not time
    the same thing (vLLM's CPU profile on every core against one-thread actors was 1.18x), and under ``full_speed:
    auto`` the trainer is moved by it, generation not. None too when the trainer_alone stage timed the step in this
    sitting (``trainer_alone_s``), or for the simulated `trainer`: the clock then moves no simulated time (the probe
    gives only its slowdowns, ratios within its own sitting)."""
    clock = gen_report.get("probe_clock")
    if not probe_clock_doubtful(clock, trainer, "trainer_alone_s" in gen_report):
        return None
    return (
        f"warning: {probe}: its calls of one engine alone ran {clock:.2f}x the profile's fit "
        "(simulate/gen_fit/probe_clock): the probe and the profile did not time the same engine at the same speed "
        "(other sittings, a busy machine, other engine settings). Time both on an idle machine, one after the other: "
        "dvc repro -f -s profile, then asp simulate probe-sharing."
    )


def probe_spread_warning(
    intervals: dict[tuple[int, bool, str], tuple[float, float, float]] | None, engines: int, probe: Path
) -> str | None:
    """A warning when a slowdown the launch meets (up to `engines` decoding at once) is uncertain by more than
    `PROBE_SPREAD_WARN` either way (half its interval's width over its value), else None (pure): the simulated run
    then moves by about as much with the probe alone, and asp's validation goal is 15 %."""
    if not intervals:
        return None
    used = {key: v for key, v in intervals.items() if key[0] <= engines and v[0] > 0}
    if not used:
        return None
    (k, training, kind), (mid, low, high) = max(used.items(), key=lambda kv: (kv[1][2] - kv[1][1]) / kv[1][0])
    if (high - low) / 2 / mid <= PROBE_SPREAD_WARN:
        return None
    what = f"a {'training step' if kind == 'step' else 'call'} with {k} engine{'s' * (k > 1)} decoding" + (
        " beside a training step" if training and kind == "call" else ""
    )
    return (
        f"warning: {probe}: the slowdown of {what} is {mid:.3g}x, anywhere in {low:.3g}-{high:.3g}x at "
        f"{100 * PROBE_LEVEL:.0f} % over its rounds: the probe ran on an unsteady machine or with too few rounds, and "
        "the simulated times move with it (asp simulate shows the range). Re-run it on an idle machine, with more "
        "rounds: asp simulate probe-sharing --repeats 20."
    )


def fit_warnings(params: Params, paths: Paths, gen_report: dict[str, float]) -> list[str]:
    """What the `simulate` stage and ``asp simulate`` warn about the fitted time model (`drift_warning`,
    `probe_clock_warning`, `probe_engine_warning`, `probe_spread_warning`)."""
    found = (
        drift_warning(gen_report, paths.timings),
        probe_clock_warning(gen_report, params.runtime.trainer.kind, paths.sharing_probe),
        probe_engine_warning(params, paths),
        probe_spread_warning(_probe_intervals(params, paths), params.runtime.total_actors, paths.sharing_probe),
    )
    return [w for w in found if w]


def probe_engine_warning(params: Params, paths: Paths) -> str | None:
    """A warning when the sharing probe in use timed other engines than the launch's (``engine`` in the probe file
    against ``runtime.engine.kind``), else None: its slowdowns and calls alone are another engine's."""
    probe = sharing_probe(params, paths)
    kind = (probe or {}).get("engine")
    if not kind or kind == params.runtime.engine.kind:
        return None
    return (
        f"warning: {paths.sharing_probe} timed {kind} engines but runtime.engine.kind is "
        f"{params.runtime.engine.kind!r}: its slowdowns and full-speed calls are another engine's. Probe this one "
        "(asp simulate probe-sharing with these params) before trusting the simulated times."
    )


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Fit, simulate every condition, save and log (see the module docstring)."""
    tracker.log_params({"simulate": params.simulate.model_dump(), "common.seed": params.common.seed})
    skip = "simulate.enabled is false: nothing simulated" if not params.simulate.enabled else untimed(paths)
    if skip:  # DVC still expects the declared outputs: say why they are empty
        metrics = {"simulate/enabled": 0}
        with atomic_path(paths.out_dir) as out:
            out.mkdir(parents=True)
            write_json(
                {"enabled": False} | ({"skipped": skip} if params.simulate.enabled else {}), out / "models.json"
            )
        write_json(metrics, paths.metrics)
        if params.simulate.enabled:
            print(f"[simulate] skipped: {skip}", file=sys.stderr, flush=True)
        save_figure(timeline_figure({}, skip.split(":")[0] + ": nothing simulated"), paths.plot, tracker)
        return metrics
    models = fit_models(params, paths)
    for warning in fit_warnings(params, paths, models.gen_report):
        print(f"[simulate] {warning}", file=sys.stderr, flush=True)
    results = simulate_conditions(params, paths, models)
    metrics = run_metrics(models, results, probe_ranges(params, paths, models, results))
    save_outputs(models, results, paths.out_dir)
    write_json(metrics, paths.metrics)
    title = f"Simulated launch ({params.runtime.trainer.kind} trainer, {params.runtime.total_actors} actors)"
    save_figure(timeline_figure({c: r.iterations for c, r in results.items()}, title), paths.plot, tracker)
    tracker.log_metrics({k: v for k, v in metrics.items() if np.isfinite(v)})
    tracker.log_dict({"models": read_json(paths.out_dir / "models.json")}, "simulate_models.json")
    return metrics


LAUNCH_PARAMS = ("runtime", "schedule", "profile", "common.seed")


def _differences(a: Any, b: Any, prefix: str) -> list[str]:
    """Dotted keys where the nested dicts `a` and `b` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _differences(a.get(k), b.get(k), f"{prefix}.{k}")]
    return [] if a == b else [f"{prefix} (launch {b!r}, here {a!r})"]


def launch_setting_differences(params: Params, lock: dict[str, Any], raw: dict[str, Any]) -> list[str]:
    """How the run `params` simulates differs from the last launch as dvc.lock records it ([] when it is the same
    setting): the ``runtime``, ``schedule``, ``profile`` and ``common.seed`` values (the launch's recorded
    sections over `raw`, the params file, validated) and ``simulate.iterations`` when it changes the step count.

    Args:
        params: the validated params simulated; lock: dvc.lock's ``stages.launch.params['params.yaml']``;
        raw: the params file as read (the sections the lock does not hold).
    """
    merged = copy.deepcopy(raw)
    for key in LAUNCH_PARAMS:
        if key in lock:
            *parents, leaf = key.split(".")
            node = merged
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = copy.deepcopy(lock[key])
    migrate_params(merged)  # a launch recorded before keys moved (`asp.config.moved_keys`)
    launched = validate_params(merged, "dvc.lock (launch)")
    here, there = params.model_dump(mode="json"), launched.model_dump(mode="json")
    diffs: list[str] = []
    for key in ("runtime", "schedule", "profile"):
        diffs += _differences(here[key], there[key], key)
    diffs += _differences(here["common"]["seed"], there["common"]["seed"], "common.seed")
    steps = params.simulate.iterations
    if steps is not None and steps != launched.runtime.iterations:
        diffs.append(f"simulate.iterations (launch ran {launched.runtime.iterations} steps, here {steps})")
    return diffs


def _lock_loader() -> type:
    """A SafeLoader that reads YAML 1.2 floats without a dot (dvc.lock writes ``1e-08``; YAML 1.1 reads a str)."""

    class Loader(yaml.SafeLoader):
        pass

    pattern = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", pattern, list("-+0123456789"))
    return Loader


_LockLoader = _lock_loader()


def last_launch(params: Params, root: Path = Path()) -> tuple[str, dict[str, float]] | str:
    """(condition, ``metrics/launch.json``) of the last launch when it ran the setting `params` describes, else
    why not: no launch, outputs that are not the launch dvc.lock records, or the differing params."""
    lock_path, metrics_path, summary = (
        root / "dvc.lock",
        root / "metrics/launch.json",
        root / "outputs/launch/summary.json",
    )
    if not (lock_path.is_file() and metrics_path.is_file() and summary.is_file()):
        return "no launch to check against (needs dvc.lock, metrics/launch.json and outputs/launch/summary.json)"
    stage = (yaml.load(lock_path.read_text(), Loader=_LockLoader) or {}).get("stages", {}).get("launch")
    if not stage:
        return "no launch to check against: dvc.lock records none"
    recorded = next((o.get("md5") for o in stage.get("outs", []) if o.get("path") == "metrics/launch.json"), None)
    if recorded != hashlib.md5(metrics_path.read_bytes()).hexdigest():
        return "no launch to check against: metrics/launch.json is not the launch dvc.lock records (`dvc status`)"
    diffs = launch_setting_differences(params, stage["params"]["params.yaml"], read_yaml(root / "params.yaml"))
    if diffs:
        more = f" and {len(diffs) - 3} more" if len(diffs) > 3 else ""
        return "no launch of this setting to check against; the last launch differs in " + "; ".join(diffs[:3]) + more
    condition = str(read_json(summary).get("condition", params.runtime.condition))
    return condition, read_json(metrics_path)
