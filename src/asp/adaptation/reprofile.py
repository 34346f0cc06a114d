"""Re-profile a running launch (drift action `reprofile`, docs/drift.md): a new predictor version for the current
policy, and a schedule of the prompts the run has not trained yet.

From the run's runtime checkpoint in `state_dir` (``outputs/launch_state/<condition>``) the Database is rebuilt and
restored; its pending work is the *remaining* prompts. `drift.reprofile_prompts` of them (seeded) are profiled with
the current policy (the checkpoint's trainer weights over outputs/policy; `profile.n_samples` samples capped at
`profile.max_new_tokens`, the `profile.engine`). A seeded `drift.reprofile_eval_fraction` is held out; the rest
fine-tunes the current predictor (the newest accepted version, else outputs/predictor = v1), warm-started, for
`drift.reprofile_epochs` (early stopping on a validation slice of the fit part). Kendall tau on the held-out part
(out of sample) is gated on `evaluate.min_tau`, and the calibration map is fitted there, as the evaluate stage
does.

Accepted: ``<state_dir>/predictors/v<k>/`` is written as a whole (profile.parquet, predictor/, calibration.json,
predictions.parquet of every training prompt, rest.parquet = the C4 schedule of the remaining prompts,
full.parquet = the C4 schedule of all training prompts, both in the schedule stage's Parquet layout, report.json)
and the predictor is registered in the MLflow Model Registry (`drift.registry_model`; tags kendall_tau,
policy_step, predictor_version, run_id). Rejected: v<k> holds profile.parquet and report.json with accepted false,
no plans; the run keeps its schedule. Every attempt gets the next number (v1 is the pipeline's predictor, so the
first re-profile is v2, accepted or not); `latest_accepted` reads back the newest accepted one. report.json holds
the `ReprofileResult` fields (accepted, version, tau, min_tau, policy_step, prompts, seconds, directory, message)
and more (kendall_tau, previous_kendall_tau, base_version, remaining / fit / eval prompts, mean_length,
truncation_rate, the fine-tuning history, timings_s, registry).

The versions directory is `asp.adaptation.versions`; the run's position and current policy `asp.adaptation.position`.

Run: `asp reprofile` (src/asp/cli/reprofile.py) on a stopped run, or in-process from the launch stage
(`asp.adaptation.launch_drift.resume_after_drift`).
Tests: `.venv/bin/python -m pytest tests/pipeline/test_reprofile.py -q`.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from asp.adaptation.position import Position, check_checkpoint, current_policy, read_position
from asp.adaptation.versions import (
    REPORT,
    VERSIONS_DIR,
    newest_accepted_version,
    schedule_frame,
    version_dir,
    versions,
)
from asp.config import Params
from asp.drift.monitor import bias
from asp.drift.reference import load_ratio_se
from asp.errors import UserError
from asp.io import atomic_path, write_json, write_parquet
from asp.predictor.calibration import CALIBRATION_FOLDS, cross_fit_calibration, fit_calibration
from asp.predictor.metrics import kendall_tau
from asp.progress import progress_bar
from asp.rollout.base import SamplingParams, timed_generate
from asp.steps.engine import profile_engine
from asp.steps.fit import fit_predictor
from asp.steps.loaders import load_trained_predictor
from asp.steps.paths import LaunchPaths
from asp.tracking import Tracker, register_predictor

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from asp.predictor.model import LengthPredictor
    from asp.predictor.train import TrainResult

# report keys logged as reprofile/<key> (with reprofile/accepted and reprofile/<timing>_s)
REPORT_METRICS: tuple[str, ...] = ("version", "kendall_tau", "previous_kendall_tau", "min_tau", "policy_step")
REPORT_METRICS += ("remaining_prompts", "prompts", "fit_prompts", "eval_prompts", "mean_length", "truncation_rate")
REPORT_METRICS += ("generated_tokens",)
MIN_EVAL, MIN_FIT = 3, 4  # held-out prompts for a tau; fit prompts for a train + validation split
SOURCE_GENERATE, SOURCE_RUN = "generate", "run"  # where a re-profile's lengths come from (report.json `source`)


@dataclass(frozen=True)
class ReprofileResult:
    """What a re-profile did: `version` k (written to `directory`), its held-out `tau` against `min_tau`, the trainer
    step of the policy profiled, the prompts profiled, the seconds it took and a one-line `message`."""

    accepted: bool
    version: int
    tau: float
    min_tau: float
    policy_step: int
    prompts: int
    seconds: float
    directory: Path
    message: str


# ---- profile, fine-tune, score ------------------------------------------------------------------------------------
def profile_lengths(params: Params, model_dir: Path, ids: list[Any], texts: list[str], seed: int) -> pd.DataFrame:
    """Sample `profile.n_samples` responses per prompt; per-prompt mean / max length and truncated fraction."""
    prof = params.profile
    engine = profile_engine(prof, model_dir, seed)
    sampling = SamplingParams(
        prof.n_samples, prof.max_new_tokens, prof.temperature, prof.top_p, seed=0
    )  # seed: each minibatch's
    rows, mb = [], prof.minibatch_prompts
    try:
        with progress_bar(total=len(ids), desc="re-profile", unit="prompt") as bar:
            for m, start in enumerate(range(0, len(ids), mb)):
                done = timed_generate(engine, texts[start : start + mb], sampling.with_seed(seed + m))
                for pid, res in zip(ids[start : start + mb], done.results, strict=True):
                    lengths = [int(s.length) for s in res.samples]
                    cut = [s.finish_reason == "length" for s in res.samples]
                    rows.append((pid, float(np.mean(lengths)), max(lengths), float(np.mean(cut)), len(lengths)))
                bar.update(len(done.results))
    finally:
        getattr(engine, "close", lambda: None)()
    return pd.DataFrame(rows, columns=["prompt_id", "mean_length", "max_length", "truncated_frac", "samples"])


def split_roles(n: int, eval_fraction: float, val_fraction: float, seed: int) -> np.ndarray:
    """Role of each of `n` profiled prompts: 'eval' (held out), 'val' (early stopping) or 'train' (seeded)."""
    n_eval = max(MIN_EVAL, int(round(eval_fraction * n)))
    n_val = max(2, int(round(val_fraction * (n - n_eval))))
    roles = np.full(n, "train", dtype=object)
    order = np.random.default_rng(seed).permutation(n)
    roles[order[:n_eval]], roles[order[n_eval : n_eval + n_val]] = "eval", "val"
    return roles


def fine_tune(
    model: LengthPredictor,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    lengths: np.ndarray,
    roles: np.ndarray,
    params: Params,
    seed: int,
) -> TrainResult:
    """Continue training the loaded predictor (its LoRA adapters made trainable again; with `predictor.lora.r: 0`
    the whole backbone, as it was trained) on the 'train' prompts, early stopping on the 'val' ones;
    `drift.reprofile_epochs` epochs at most."""
    full = model.spec.lora_r == 0
    for name, p in model.backbone.named_parameters():
        if full or "lora_" in name:
            p.requires_grad_(True)

    def part(role: str) -> tuple[list[str], np.ndarray]:
        idx = np.flatnonzero(roles == role)
        return [texts[i] for i in idx], lengths[idx]

    epochs = params.drift.reprofile_epochs
    return fit_predictor(model, tokenizer, part("train"), part("val"), params.predictor, epochs=epochs, seed=seed)


# ---- the re-profile ---------------------------------------------------------------------------------------------
@dataclass
class Attempt:
    """What one re-profile measured (the report's content besides the plans)."""

    state_dir: Path
    version: int
    base_version: int
    reason: str
    position: Position
    profiled: pd.DataFrame | None = None
    tau: float = float("nan")
    old_tau: float = float("nan")
    history: list[dict[str, Any]] | None = None
    seconds: dict[str, float] | None = None
    references: dict[str, float] | None = None  # the drift detector's bias reference (+ se) of the new calibration
    source: str = SOURCE_GENERATE  # generate: fresh profiling rollouts; run: the run's own realized lengths

    @property
    def lengths_file(self) -> str:
        """The file of `profiled` in the version directory: profile.parquet (generated) or history.parquet."""
        return "history.parquet" if self.source == SOURCE_RUN else "profile.parquet"

    def report(self, result: ReprofileResult, extra: dict[str, Any]) -> dict[str, Any]:
        prof = self.profiled
        roles = prof["role"].value_counts().to_dict() if prof is not None else {}
        truncated = prof is not None and "truncated_frac" in prof.columns
        generated = prof is not None and "generated_tokens" in prof.columns
        return {
            **asdict(result),
            "directory": str(result.directory),
            "tau": _num(result.tau),
            "kendall_tau": _num(result.tau),
            "previous_kendall_tau": _num(self.old_tau),
            "reason": self.reason,
            "base_version": self.base_version,
            "remaining_prompts": len(self.position.pending),
            "fit_prompts": int(roles.get("train", 0) + roles.get("val", 0)),
            "eval_prompts": int(roles.get("eval", 0)),
            "mean_length": None if prof is None else float(prof["mean_length"].mean()),
            "truncation_rate": float(prof["truncated_frac"].mean()) if prof is not None and truncated else None,
            "source": self.source,
            "generated_tokens": round(float(prof["generated_tokens"].sum())) if prof is not None and generated else 0,
            "history": self.history or [],
            "timings_s": self.seconds or {},
            **{k: _num(v) for k, v in (self.references or {}).items()},
            **extra,
        }


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def reprofile(
    params: Params, state_dir: Path, tracker: Tracker, *, reason: str = "manual", paths: LaunchPaths | None = None
) -> ReprofileResult:
    """Re-profile the stopped run in `state_dir` (see the module docstring) from the launch's inputs at `paths`
    (default: the repository's); returns what was done.

    Raises:
        UserError: no runtime checkpoint, a finished run, missing pipeline outputs.
    """
    t0, state_dir, paths = time.perf_counter(), Path(state_dir), paths or LaunchPaths()
    check_checkpoint(state_dir)  # before any other file is read
    prompts = load_train_prompts(paths.prompts)
    position = read_position(params, paths, state_dir, dict(zip(prompts["prompt_id"], prompts["prompt"], strict=True)))
    base = newest_accepted_version(state_dir)
    attempt = Attempt(state_dir, max(versions(state_dir), default=1) + 1, base, reason, position)
    candidates = position.pending or prompts["prompt_id"].tolist()  # none pending: the next pass (iterations)
    if min(params.drift.reprofile_prompts, len(candidates)) < MIN_EVAL + MIN_FIT:
        msg = f"only {len(candidates)} prompts remain, too few to re-profile; the run keeps its schedule"
        return finish(params, attempt, tracker, t0, accepted=False, message=msg)
    model, tokenizer, meta = load_trained_predictor(current_predictor_dir(state_dir, paths, base), params.predictor)
    field = meta.get("text_field", params.predictor.text_field)
    new_pred, true = measure(
        params, paths, attempt, prompts.set_index("prompt_id"), candidates, field, model, tokenizer
    )
    return conclude(params, attempt, tracker, t0, (model, tokenizer, meta), prompts, field, new_pred, true)


def conclude(
    params: Params,
    attempt: Attempt,
    tracker: Tracker,
    t0: float,
    loaded: tuple[Any, Any, dict[str, Any]],
    prompts: pd.DataFrame,
    field: str,
    new_pred: np.ndarray,
    true: np.ndarray,
) -> ReprofileResult:
    """Gate the fine-tuned predictor (`loaded`: model, tokenizer, meta) on its held-out tau (`attempt.tau`); when it
    passes, fit the calibration on the held-out part (`new_pred` against `true`), predict every training prompt,
    schedule them and write the version (`finish`). Shared by both re-profiles."""
    model, tokenizer, meta = loaded
    position, base, min_tau = attempt.position, attempt.base_version, params.evaluate.min_tau
    if not (math.isfinite(attempt.tau) and attempt.tau >= min_tau):
        more = (
            "Use more of the run's history (drift.refit_prompts)"
            if attempt.source == SOURCE_RUN
            else "Profile more prompts (drift.reprofile_prompts)"
        )
        msg = (
            f"v{attempt.version} rejected: held-out Kendall tau {attempt.tau:.3f} is below evaluate.min_tau = "
            f"{min_tau} (v{base}: {attempt.old_tau:.3f}); the run keeps the schedule of v{base}. {more}, train "
            "longer (drift.reprofile_epochs) or lower evaluate.min_tau."
        )
        return finish(params, attempt, tracker, t0, accepted=False, message=msg)

    calibration = fit_calibration(new_pred, true)
    out_of_fold = cross_fit_calibration(new_pred, true, min(CALIBRATION_FOLDS, len(true)))  # as evaluate measures it
    attempt.references = {
        "bias_reference": bias(out_of_fold, true),
        "bias_reference_se": load_ratio_se(out_of_fold, true),
    }
    preds, plans = new_plans(params, model, tokenizer, prompts, field, calibration, position.pending)
    msg = (
        f"v{attempt.version} accepted: held-out Kendall tau {attempt.tau:.3f} >= evaluate.min_tau {min_tau} "
        f"(v{base}: {attempt.old_tau:.3f}); re-scheduled the {len(position.pending)} remaining prompts"
    )
    saved = {"model": model, "tokenizer": tokenizer, "calibration": calibration, "predictions": preds, "plans": plans}
    saved["meta"] = {
        **meta,
        "reprofile": {"version": attempt.version, "source": attempt.source, "history": attempt.history},
    }
    return finish(params, attempt, tracker, t0, accepted=True, message=msg, saved=saved)


def measure(
    params: Params,
    paths: LaunchPaths,
    attempt: Attempt,
    prompts: pd.DataFrame,
    candidates: list[Any],
    field: str,
    model: Any,
    tokenizer: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """Profile a seeded sample of `candidates` with the current policy, score the old predictor on its held-out
    part, fine-tune on the rest and score again (into `attempt`). Returns the new predictions and the profiled
    mean lengths [n_eval] of the held-out part."""
    drift, seed = params.drift, params.common.seed + 7919 * attempt.version
    n = min(drift.reprofile_prompts, len(candidates))
    chosen = [candidates[i] for i in np.random.default_rng(seed).choice(len(candidates), n, replace=False)]
    t1 = time.perf_counter()
    with current_policy(paths.policy, attempt.position.weights, attempt.state_dir / VERSIONS_DIR) as model_dir:
        prof = profile_lengths(params, model_dir, chosen, prompts.loc[chosen, "prompt"].tolist(), seed)
    prof["role"] = split_roles(n, drift.reprofile_eval_fraction, params.predictor.val_fraction, seed + 1)
    prof["generated_tokens"] = prof["mean_length"] * prof["samples"]
    attempt.seconds = {"profile": time.perf_counter() - t1}
    return fit_and_score(params, attempt, prof, prompts.loc[chosen, field].tolist(), model, tokenizer, seed)


def fit_and_score(
    params: Params,
    attempt: Attempt,
    frame: pd.DataFrame,
    texts: list[str],
    model: Any,
    tokenizer: Any,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Score the current predictor on the 'eval' rows of `frame` (its `role` and `mean_length` columns; `texts` row
    by row), fine-tune it on the others (warm start) and score again, out of sample (into `attempt`, which keeps
    `frame`). Returns the new predictions and the mean lengths of the held-out rows."""
    from asp.predictor.train import predict_lengths

    bs, lengths = params.predict.batch_size, frame["mean_length"].to_numpy(np.float64)
    held = np.flatnonzero(frame["role"].to_numpy() == "eval")
    held_texts = [texts[i] for i in held]
    attempt.old_tau = kendall_tau(predict_lengths(model, tokenizer, held_texts, batch_size=bs), lengths[held])
    t2 = time.perf_counter()
    result = fine_tune(model, tokenizer, texts, lengths, frame["role"].to_numpy(), params, seed)
    new_pred = predict_lengths(model, tokenizer, held_texts, batch_size=bs)
    attempt.tau, attempt.profiled = kendall_tau(new_pred, lengths[held]), frame
    attempt.history = [{k: v for k, v in asdict(h).items() if k != "seconds"} for h in result.history]
    attempt.seconds = {**(attempt.seconds or {}), "train": time.perf_counter() - t2}
    return new_pred, lengths[held]


def new_plans(
    params: Params,
    model: Any,
    tokenizer: Any,
    prompts: pd.DataFrame,
    field: str,
    calibration: Any,
    pending: list[Any],
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Predictions of every training prompt with the new predictor, and the schedules ``full`` (all of them) and
    ``rest`` (the `pending` ones; absent when none is pending)."""
    from asp.predictor.train import predict_lengths

    predicted = predict_lengths(model, tokenizer, prompts[field].tolist(), batch_size=params.predict.batch_size)
    preds = pd.DataFrame(
        {"prompt_id": prompts["prompt_id"], "predicted_length": predicted, "calibrated_length": calibration(predicted)}
    )
    plans = {"full": schedule_frame(params, preds, calibration)}
    if pending:
        plans["rest"] = schedule_frame(params, preds.set_index("prompt_id").loc[pending].reset_index(), calibration)
    return preds, plans


def load_train_prompts(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise UserError(f"{path}: missing. Run the prepare stage first (`dvc repro prepare`).")
    return pd.read_parquet(path)


def current_predictor_dir(state_dir: Path, paths: LaunchPaths, version: int) -> Path:
    """The predictor of `version` (1: the pipeline's outputs/predictor)."""
    return paths.predictor if version == 1 else version_dir(state_dir, version) / "predictor"


def finish(
    params: Params,
    attempt: Attempt,
    tracker: Tracker,
    t0: float,
    *,
    accepted: bool,
    message: str,
    saved: dict[str, Any] | None = None,
) -> ReprofileResult:
    """Write ``v<k>`` as a whole (plans and predictor only when accepted), register an accepted predictor, log to
    `tracker` at the policy step, say what happened."""
    k, out = attempt.version, version_dir(attempt.state_dir, attempt.version)
    registry: dict[str, Any] = {"name": params.drift.registry_model, "version": None}
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        if attempt.profiled is not None:
            write_parquet(attempt.profiled, tmp / attempt.lengths_file)
        if saved is not None:
            save_accepted(params, saved, tmp)
            tags = {"kendall_tau": attempt.tau, "policy_step": attempt.position.step, "predictor_version": k}
            registry["version"] = register_predictor(
                tracker,
                params.drift.registry_model,
                tmp / "predictor",
                tags,
                artifact_path=f"predictors/v{k}/predictor",
            )
        seconds = time.perf_counter() - t0
        attempt.seconds = {**(attempt.seconds or {}), "total": seconds}
        prompts = 0 if attempt.profiled is None else len(attempt.profiled)
        result = ReprofileResult(
            accepted, k, attempt.tau, params.evaluate.min_tau, attempt.position.step, prompts, seconds, out, message
        )
        report = attempt.report(result, {"registry": registry})
        write_json(report, tmp / REPORT)
    log_attempt(tracker, attempt, report)
    print(f"[reprofile] {message}", file=sys.stderr)
    return result


def save_accepted(params: Params, saved: dict[str, Any], out: Path) -> None:
    """predictor/, calibration.json, predictions.parquet, full.parquet and (when prompts remain) rest.parquet."""
    from asp.steps.checkpoint import save_predictor

    save_predictor(
        saved["model"], saved["tokenizer"], out / "predictor", saved["meta"], backbone_ref=params.predictor.backbone
    )
    write_json(saved["calibration"].to_dict(), out / "calibration.json")
    write_parquet(saved["predictions"], out / "predictions.parquet")
    for name, frame in saved["plans"].items():
        write_parquet(frame, out / f"{name}.parquet")


def log_attempt(tracker: Tracker, attempt: Attempt, report: dict[str, Any]) -> None:
    """``reprofile/*`` metrics at the policy step, the report as an artifact and a tag with the outcome."""
    metrics = {f"reprofile/{key}": report[key] for key in REPORT_METRICS if report[key] is not None}
    metrics["reprofile/accepted"] = int(report["accepted"])
    metrics.update({f"reprofile/{key}_s": v for key, v in report["timings_s"].items()})
    tracker.log_metrics(metrics, step=attempt.position.step)
    tracker.log_dict(report, f"predictors/v{attempt.version}/{REPORT}")
    tracker.set_tags({f"asp.reprofile.v{attempt.version}": report["message"][:5000]})
