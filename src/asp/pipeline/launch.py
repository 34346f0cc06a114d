"""`launch` stage: the asynchronous multi-instance RL run that consumes the schedule (paper §4, appendix B).

Generation actors (hf on CPU, vLLM on GPUs) in Generation Units decode the scheduled minibatches in dispatch
order; completed minibatches flow through the bounded Training Queue to the Training Unit. `runtime.trainer.kind`
picks it: ``grpo`` trains the policy (rewards from the task's verifier, GRPO updates, weight snapshots the
actors load after their current minibatch, policy lag measured and bounded by `runtime.queue.max_policy_lag`);
``simulated`` sleeps a fixed step time (the paper's Table 4(b) scheduling setting). `runtime.condition` picks
the schedule: C4 is the `schedule` stage's output; C0-C3 are rebuilt from the same predictions.

The run checkpoints its position (and the GRPO trainer its weights and optimizer) under
outputs/launch_state/<condition>/, which DVC keeps between runs: an interrupted run resumes there, in the
same MLflow run with steps continuing, and the runtime's run log there makes the summary, iterations.parquet and
minibatches.parquet cover the whole run. A run killed after its last step but before the stage finished (the
held-out evaluation, the outputs) is finished by the rerun without training again; a run killed before its first
checkpoint starts afresh in the same MLflow run (`asp.steps.launch_state`). Ray processes a killed launch left
running are stopped when the next one starts (`asp.runtime.raysession`).

With the grpo trainer on the built-in demo task, the stage then measures the held-out reward before and after
training (`asp.trainers.heldout`): `runtime.heldout_problems` new problems that are not among the run's prompts,
4 samples each, decoded by the initial policy and by the run's final trainer weights with the same seed
(``grpo/heldout_reward_before`` / ``_after``, their paired gain and its standard error). Other datasets have no
held-out split excluded from GRPO training, so there ``grpo/heldout_measured`` is 0 and ``grpo/heldout_note``
says why.

With the grpo trainer on the demo task the stage also draws the learning curve (`asp.steps.learning_curve`): the
weights of every `runtime.grpo.eval_interval`-th step are kept while the run trains, and after it each is scored on
a fixed subset of held-out problems (``learning/...``: every point against the step and the run's elapsed
iteration time, the area under the curve, the best; MLflow series; plots/learning_curve.png). Evaluation runs after
training, so its seconds (``learning/eval_seconds``) are never part of an iteration time; a rerun after a kill
evaluates only the steps not yet measured.

Writes outputs/launch/ (summary.json, iterations.parquet, minibatches.parquet), metrics/launch.json,
plots/launch_timeline.png and plots/learning_curve.png; logs every iteration to MLflow.

With ``drift.enabled`` a `DriftWatch` observes every ingested minibatch (``drift/...`` metrics per window, warn /
recalibrate / reprofile on confirmed drift); a session stopped for a re-profile is re-profiled and resumed here,
or handed off to the Prefect drift loop (``ASP_DRIFT_HANDOFF=1``). `asp.adaptation` holds that part;
metrics/launch.json then gets ``drift/summary/...`` and plots/launch_drift.png is drawn. Without it the stage
does exactly what it did before.

Run: `asp stage launch` (what `dvc repro launch` calls).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from asp.adaptation import launch_drift
from asp.config import DEMO_DATASET, Params, RuntimeParams
from asp.errors import UserError
from asp.io import atomic_path, write_json, write_parquet
from asp.plots import save_figure
from asp.plots.learning import learning_curve_figure
from asp.runtime import grpo_summary
from asp.runtime.raysession import reap_dead_sessions
from asp.runtime.runlog import RunLog
from asp.runtime.testhooks import kill_point, trainer_ledger
from asp.steps.engine import engine_spec
from asp.steps.launch_state import HISTORY_FILE, Recorder, continued_run_id, fingerprint_extra, start_session
from asp.steps.learning_curve import CURVE_PREFIX, WeightKeeper, interval_of, measure_curve
from asp.steps.loaders import policy_model_path
from asp.steps.memory_check import checked, enforce
from asp.steps.paths import LaunchPaths as Paths
from asp.steps.scheduling import load_plan
from asp.tracking import Tracker
from asp.trainers import learning, make_trainer_factory
from asp.trainers.heldout import HELDOUT_SAMPLES, compare_heldout, final_weights, heldout_problems

if TYPE_CHECKING:
    from collections.abc import Callable

    from matplotlib.figure import Figure

    from asp.adaptation.watch import DriftWatch
    from asp.control.metrics import RunSummary
    from asp.control.plan import WorkPlan
    from asp.runtime.config import RuntimeConfig
    from asp.runtime.engines import EngineSpec
    from asp.runtime.runlog import RunHistory
    from asp.runtime.trainer import Trainer

HELDOUT_NOTE = "heldout"  # the run-log note that keeps the measured held-out reward for a rerun


@dataclass(frozen=True)
class ResumePoint:
    """The run's plan and config, and the checkpoint it continues from (None: a fresh run, `reason` says why).

    `finished` is (summary, run history) of a run that finished but whose end-of-run work a kill cut short
    (`asp.runtime.run.finished_run`): the stage finishes that work and trains nothing."""

    plan: WorkPlan
    config: RuntimeConfig
    extra: dict[str, Any]
    directory: Path
    state: dict[str, Any] | None
    reason: str
    fingerprint: str = ""
    finished: tuple[RunSummary, RunHistory] | None = None

    @property
    def step(self) -> int:
        return int(self.state["trainer_step"]) if self.state else 0


def resume_point(params: Params, paths: Paths) -> ResumePoint:
    """Load the plan and decide whether `outputs/launch_state/<condition>` holds a run to continue or finish."""
    from asp.runtime import RuntimeConfig, make_checkpointer
    from asp.runtime.run import finished_run

    runtime = params.runtime
    plan = load_plan(params, paths)
    config = RuntimeConfig.from_params(params)
    extra = fingerprint_extra(runtime)
    directory = paths.state_dir / runtime.condition
    checkpointer = make_checkpointer(plan, config, directory, extra)
    state, reason = checkpointer.load()
    finished = finished_run(plan, config, directory, extra) if state is None else None
    return ResumePoint(plan, config, extra, directory, state, reason, checkpointer.fingerprint, finished)


def resume_run_id(params: Params, paths: Paths) -> str | None:
    """The MLflow run this launch continues (None: a new run); see `asp.steps.launch_state`."""
    try:
        point = resume_point(params, paths)
    except UserError:
        return None  # `run` reports it
    resumable = point.state is not None or point.finished is not None
    return continued_run_id(point.directory, point.fingerprint, resumable)


def trainer_factory(
    params: Params, paths: Paths, point: ResumePoint, prompts: pd.DataFrame, prompts_by_id: dict[Any, str]
) -> Callable[[], Trainer]:
    """The Training Unit's factory for `runtime.trainer.kind` (checked here, before any actor starts)."""
    runtime = params.runtime
    if runtime.trainer.kind != "grpo":
        factory = make_trainer_factory(runtime.trainer.kind, point.config)
        ledger = trainer_ledger()  # test hook: what the simulated trainer trained, step by step
        if ledger is None:
            return factory
        return functools.partial(cast("Callable[..., Trainer]", factory), ledger_path=ledger)  # SimulatedTrainer arg
    if "answer" not in prompts.columns:
        raise UserError(
            f"{paths.prompts}: no 'answer' column; the grpo trainer needs each prompt's reference answer "
            "(prepare.answer_field). Re-run prepare, or use runtime.trainer.kind: simulated."
        )
    per_pass = -(-len(point.plan.prompt_ids()) // runtime.global_batch_prompts)
    return make_trainer_factory(
        "grpo",
        point.config,
        policy_path=policy_model_path(paths.policy),
        prompts=prompts_by_id,
        answers=dict(zip(prompts["prompt_id"], prompts["answer"].astype(str), strict=True)),
        grpo=runtime.grpo,
        dataset=params.prepare.dataset,
        state_dir=point.directory,
        total_steps=per_pass,
    )


def timeline_figure(iterations: list[dict[str, float]]) -> Figure:
    """Figure: iteration time and Training Queue depth per trainer step; with GRPO, reward and policy lag."""
    import matplotlib.pyplot as plt

    def col(key: str) -> list[float]:
        return [it.get(key, np.nan) for it in iterations]

    steps = [it.get("step", i) for i, it in enumerate(iterations)]
    grpo = any("train/reward_mean" in it for it in iterations)
    fig, axes = plt.subplots(4 if grpo else 2, 1, figsize=(7, 9 if grpo else 5), sharex=True)
    axes[0].plot(steps, col("runtime/iteration_time_s"), "o-", ms=3)
    axes[0].set(ylabel="iteration time (s)", title="Asynchronous run")
    axes[1].plot(steps, col("runtime/queue_depth_prompts"), "o-", ms=3, color="#cc6677")
    axes[1].set(ylabel="queue depth (prompts)")
    if grpo:
        reward = np.asarray(col("train/reward_mean"), dtype=float)
        axes[2].plot(steps, reward, ".", color="#88ccee", label="batch mean")
        w = min(20, len(reward))
        if w > 1:
            moving = np.convolve(reward, np.ones(w) / w, mode="valid")
            axes[2].plot(steps[w - 1 :], moving, "-", color="#117733", label=f"{w}-step moving mean")
        axes[2].set(ylabel="reward")
        axes[2].legend(loc="upper left", fontsize=8)
        axes[3].plot(steps, col("train/lag_max"), ".", color="#aa4499", label="max")
        axes[3].plot(steps, col("train/lag_mean"), "-", color="#332288", lw=0.8, label="mean")
        axes[3].plot(steps, col("train/d_off_estimate_mean"), "-", color="#ddcc77", lw=0.8, label="d_off estimate")
        axes[3].set(ylabel="policy lag (steps)")
        axes[3].legend(loc="upper left", fontsize=8, ncol=3)
    axes[-1].set(xlabel="trainer step")
    fig.tight_layout()
    return fig


def curve_figure(points: list[dict[str, float]], note: str) -> Figure:
    """plots/learning_curve.png: held-out reward vs step and vs wall-clock, or a panel saying why there is none."""
    fig = learning_curve_figure({"held-out reward": points} if points else {}, title="Learning curve")
    if not points:
        fig.axes[0].text(0.02, 0.5, note, transform=fig.axes[0].transAxes, fontsize=8, wrap=True)
    return fig


def load_prompts(path: Path) -> tuple[pd.DataFrame, dict[Any, str]]:
    """The training prompts (prepare stage output) and the prompt id -> text mapping the actors decode."""
    if not path.is_file():
        raise UserError(f"{path}: missing. Run the prepare stage first (`dvc repro prepare`).")
    prompts = pd.read_parquet(path)
    return prompts, dict(zip(prompts["prompt_id"], prompts["prompt"], strict=True))


def begin(point: ResumePoint, runtime: RuntimeParams, tracker: Tracker) -> None:
    """Record this session in the state directory (`asp.steps.launch_state.start_session`) and say what it does; a
    fresh run forgets an earlier run's learning curve, a resumed one keeps the weights its last checkpoint holds."""
    start_session(point.directory, point.state is None, point.step, tracker.run_id, point.fingerprint)
    if point.state is None:
        learning.reset(point.directory)
    else:
        learning.keep_checkpointed(point.directory, interval_of(runtime))
    done = f"after step {point.step}" if point.state is not None else f"fresh run ({point.reason})"
    print(f"[launch] {runtime.condition}, trainer {runtime.trainer.kind}: {done}", file=sys.stderr)


def run_session(
    point: ResumePoint,
    prompts_by_id: dict[Any, str],
    engine: EngineSpec,
    factory: Callable[[], Trainer],
    runtime: RuntimeParams,
    tracker: Tracker,
    watch: DriftWatch | None = None,
) -> RunSummary:
    """`asp.runtime.run_async` from `point`, every iteration logged to `tracker` and appended to the history
    (and every ingested minibatch shown to the drift `watch`, when there is one)."""
    from asp.runtime import run_async

    hooks = {} if watch is None else {"observer": watch, "on_start": watch.on_start}
    recorder = Recorder(point.directory / HISTORY_FILE, runtime.iterations, initial=point.step)
    keeper = WeightKeeper(point.directory, interval_of(runtime))

    def on_iteration(cu: Any, metrics: dict[str, float]) -> None:
        recorder(cu, metrics)
        keeper(cu, metrics)

    try:
        return run_async(
            point.plan,
            prompts_by_id,
            engine,
            point.config,
            trainer_factory=factory,
            logger=tracker,
            checkpoint_dir=point.directory,
            resume=point.state is not None,
            fingerprint_extra=point.extra,
            on_iteration=on_iteration,
            **hooks,
        )
    finally:
        recorder.close()


def run_metrics(summary: Any, trainer: str) -> dict[str, Any]:
    """The runtime's summary metrics (whole run), where the run resumed and whether it finished; grpo/ ones over
    the run's iterations."""
    metrics = {k: float(v) for k, v in summary.metrics.items()}
    metrics.update(
        {
            "runtime/summary/resumed_from_step": summary.resumed_from_step,
            "runtime/summary/finished": int(summary.finished),
        }
    )
    if trainer == "grpo":
        metrics.update(grpo_summary(summary.iterations))
    return metrics


def save_outputs(
    out_dir: Path, runtime: RuntimeParams, summary: Any, metrics: dict[str, Any], run_id: str | None
) -> None:
    """summary.json, iterations.parquet and minibatches.parquet (both the whole run), replaced together."""
    with atomic_path(out_dir) as out:
        out.mkdir(parents=True)
        write_json(
            {
                "condition": runtime.condition,
                "trainer": runtime.trainer.kind,
                "resume_reason": summary.resume_reason,
                "trainer_step": summary.trainer_step,
                "policy_version": summary.policy_version,
                "mlflow_run_id": run_id,
                "metrics": metrics,
            },
            out / "summary.json",
        )
        write_parquet(pd.DataFrame(summary.iterations), out / "iterations.parquet")
        write_parquet(pd.DataFrame(summary.minibatches), out / "minibatches.parquet")


def heldout_metrics(
    params: Params, paths: Paths, point: ResumePoint, prompts: pd.DataFrame, trainer_step: int
) -> dict[str, Any]:
    """``grpo/heldout_*``: the demo reward on new problems of the initial policy and of the run's final weights
    (the newest trainer checkpoint; ``grpo/heldout_weights_step`` is its step, `trainer_step` where the run ended).

    Not measured (``grpo/heldout_measured`` 0, ``grpo/heldout_note`` says why) for datasets other than the
    built-in demo, when `runtime.heldout_problems` is 0, or when the run left no trainer checkpoint.
    """
    runtime, seed, dataset = params.runtime, params.common.seed, params.prepare.dataset
    final = final_weights(point.directory)
    reasons = (
        (dataset != DEMO_DATASET, f"{dataset} has no held-out split excluded from GRPO training"),
        (runtime.heldout_problems == 0, "runtime.heldout_problems is 0"),
        (final is None, f"no trainer checkpoint in {point.directory}"),
    )
    reason = next((why for hit, why in reasons if hit), None)
    if reason is not None or final is None:
        return {"grpo/heldout_measured": 0, "grpo/heldout_note": f"not measured: {reason}"}
    try:
        records, skipped = heldout_problems(runtime.heldout_problems, seed=seed, exclude=set(prompts["problem"]))
    except ValueError as exc:
        raise UserError(f"runtime.heldout_problems: {exc}") from None
    temperature = (
        runtime.sampling.temperature if runtime.sampling.temperature > 0 else 1.0
    )  # the demo sampler does not decode greedily
    print(f"[launch] held-out reward: {len(records)} new problems x {HELDOUT_SAMPLES} samples", file=sys.stderr)
    measured = compare_heldout(
        policy_model_path(paths.policy),
        final[0],
        records,
        samples=HELDOUT_SAMPLES,
        max_new_tokens=runtime.sampling.max_new_tokens,
        seed=seed,
        temperature=temperature,
        device=runtime.grpo.device,
        num_threads=runtime.engine.num_threads,
    )
    return {
        "grpo/heldout_measured": 1,
        "grpo/heldout_note": "new demo problems, none among the run's prompts; after = trainer weights of step "
        + (f"{final[1]}" if final[1] == trainer_step else f"{final[1]}, not the last step {trainer_step}"),
        "grpo/heldout_problems": len(records),
        "grpo/heldout_samples": HELDOUT_SAMPLES,
        "grpo/heldout_skipped_seen": skipped,
        "grpo/heldout_temperature": temperature,
        "grpo/heldout_weights_step": final[1],
        **{f"grpo/heldout_{k}": v for k, v in measured.items()},
    }


def drift_watch(params: Params, paths: Paths, point: ResumePoint, tracker: Tracker) -> DriftWatch | None:
    """The `DriftWatch` of this run (None when ``drift.enabled`` is false); a fresh run forgets old drift state,
    a resumed one consumes a pending hand-off, a finished one reads its history back."""
    if not params.drift.enabled:
        return None
    if point.finished is not None:
        return launch_drift.finished_watch(params, paths, point.plan, point.directory, tracker)
    if point.state is None:
        launch_drift.reset_fresh(point.directory)
    else:
        launch_drift.consume_pending(point.directory)
    return launch_drift.build_watch(params, paths, point.plan, point.directory, tracker)


def train(
    params: Params,
    paths: Paths,
    point: ResumePoint,
    prompts: pd.DataFrame,
    prompts_by_id: dict[Any, str],
    tracker: Tracker,
) -> tuple[RunSummary, DriftWatch | None, ResumePoint]:
    """Run (or resume) the training sessions, re-profiling in between while drift stops them; returns the last
    session's `RunSummary` (covering the whole run), the drift watch (or None) and the last `ResumePoint`."""
    runtime = params.runtime
    factory = trainer_factory(params, paths, point, prompts, prompts_by_id)
    watch = drift_watch(params, paths, point, tracker)
    begin(point, runtime, tracker)
    tracker.log_params({"runtime": runtime.model_dump(), "common.seed": params.common.seed})
    kill_point("launch:start")
    engine = engine_spec(runtime, policy_model_path(paths.policy))
    summary = run_session(point, prompts_by_id, engine, factory, runtime, tracker, watch)
    if watch is not None:  # re-profile and resume in-process while the watch stops the run (not in hand-off mode)

        def resume() -> RunSummary:
            nonlocal point
            point = resume_point(params, paths)
            begin(point, runtime, tracker)
            return run_session(point, prompts_by_id, engine, factory, runtime, tracker, watch)

        summary = launch_drift.resume_after_drift(params, paths, watch, summary, tracker, resume)
    return summary, watch, point


def finish_pending(
    params: Params, paths: Paths, point: ResumePoint, tracker: Tracker
) -> tuple[RunSummary, DriftWatch | None]:
    """A run that finished but was killed before the end of this stage: log what the kill kept from MLflow (steps,
    summary) and return its summary and drift watch; nothing is trained again."""
    from asp.runtime.run import log_finished

    if point.finished is None:
        raise ValueError("finish_pending: the resume point holds no finished run")
    summary, history = point.finished
    runtime = params.runtime
    print(
        f"[launch] {runtime.condition}, trainer {runtime.trainer.kind}: the run finished at step "
        f"{summary.trainer_step} "
        "but the stage was stopped before its end (held-out evaluation, outputs, final metrics); finishing that now "
        "(nothing is trained again)",
        file=sys.stderr,
    )
    log_finished(point.directory, summary, history, tracker)
    return summary, drift_watch(params, paths, point, tracker)


def measured_heldout(
    params: Params, paths: Paths, point: ResumePoint, prompts: pd.DataFrame, summary: RunSummary
) -> dict[str, Any]:
    """`heldout_metrics` of a finished run, measured once: kept in the run log (a rerun after a kill reuses it)."""
    step = summary.trainer_step
    if point.finished is not None and HELDOUT_NOTE in point.finished[1].notes:
        return dict(point.finished[1].notes[HELDOUT_NOTE])
    measured = heldout_metrics(params, paths, point, prompts, step)
    if summary.finished:
        RunLog(point.directory).note(HELDOUT_NOTE, step, measured)
    return measured


def end_of_run(
    params: Params,
    paths: Paths,
    point: ResumePoint,
    prompts: pd.DataFrame,
    summary: RunSummary,
    watch: DriftWatch | None,
    tracker: Tracker,
) -> dict[str, Any]:
    """Metrics, the held-out reward (grpo), outputs, metrics file and plots; the end-of-run metrics go to MLflow in
    one call at the end, then the run log is closed (a rerun starts a new run)."""
    from asp.runtime.run import close_run

    runtime = params.runtime
    metrics = run_metrics(summary, runtime.trainer.kind)
    final: dict[str, Any] = {}
    if watch is not None:
        drift = launch_drift.finish(watch, summary, point.directory, paths.drift_plot, tracker, log=False)
        metrics.update(drift)
        final.update(drift)
    points: list[dict[str, float]] = []
    if runtime.trainer.kind == "grpo" and not summary.stopped:
        curve, points = measure_curve(
            params,
            point.directory,
            policy_model_path(paths.policy),
            set(prompts["problem"]) if "problem" in prompts.columns else set(),
            summary.iterations,
            summary.trainer_step,
            tracker,
        )
        metrics.update(curve)
        metrics.update(measured_heldout(params, paths, point, prompts, summary))
        kill_point("launch:evaluated")
    elif runtime.trainer.kind == "grpo":
        stopped = "not measured: the run stopped for drift"
        metrics.update({"grpo/heldout_measured": 0, "grpo/heldout_note": stopped})
        metrics.update({"learning/measured": 0, "learning/note": stopped})
    save_outputs(paths.out_dir, runtime, summary, metrics, tracker.run_id)
    kill_point("launch:outputs")
    write_json(metrics, paths.metrics)
    save_figure(timeline_figure(summary.iterations), paths.plot, tracker)
    save_figure(
        curve_figure(points, metrics.get("learning/note", "not measured: runtime.trainer.kind is not grpo")),
        paths.curve_plot,
        tracker,
    )
    grpo = (
        {k: v for k, v in metrics.items() if k.startswith(("grpo/", "learning/")) and not k.startswith(CURVE_PREFIX)}
        if runtime.trainer.kind == "grpo"
        else {}
    )
    final.update(grpo)
    numbers = {k: float(v) for k, v in final.items() if isinstance(v, int | float)}
    tracker.log_metrics(numbers, step=summary.trainer_step)
    tracker.set_tags({k.replace("/", "."): v for k, v in grpo.items() if isinstance(v, str)})
    if summary.finished:
        close_run(point.directory, summary.trainer_step)
    return metrics


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Run the asynchronous RL loop over the schedule (or finish a run a kill cut short after its last step); write
    the run summary, metrics and plot."""
    if checked(params):  # fits-or-fails before any worker starts (runtime.memory, docs/memory.md)
        enforce(params)
    reap_dead_sessions()  # Ray processes a killed launch left running
    prompts, prompts_by_id = load_prompts(paths.prompts)
    point = resume_point(params, paths)
    if point.finished is not None:
        summary, watch = finish_pending(params, paths, point, tracker)
    else:
        summary, watch, point = train(params, paths, point, prompts, prompts_by_id, tracker)
        kill_point("launch:trained")
    return end_of_run(params, paths, point, prompts, summary, watch, tracker)
