"""Re-profile without generation (drift action `refit_from_run`, docs/drift.md): fine-tune the predictor on the
realized lengths the run has already produced.

A launch with ``runtime.history`` on keeps every trained prompt's realized lengths in its runtime checkpoint (the
per-prompt `asp.schedule.history.LengthHistory`: policy version, n samples, mean length of each visit; exactly
once across kills and resumes). `refit_from_run` reads it from the stopped run in `state_dir` and does what
`asp.adaptation.reprofile.reprofile` does after its profiling rollouts, on these lengths instead:

* targets (`history_targets`, pure): each prompt's current mean length from its visits alone (the shrinkage
  estimator `history_loads` with no prediction, kappa 0, ``runtime.history.drift_per_version``: newer visits and
  more samples weigh more);
* the `drift.refit_prompts` prompts most recently trained (`choose_recent`: the newest visit first, seeded among
  equals), at least `drift.refit_min_prompts` of them, else the attempt is rejected with a message and the run
  keeps its schedule;
* a seeded `drift.reprofile_eval_fraction` of them held out: Kendall tau on those prompts (out of sample, they
  are not fine-tuned on) gates the new version on `evaluate.min_tau`, and the calibration is fitted on them;
* the predictor fine-tuned for `drift.reprofile_epochs`, warm-started from the newest accepted version;
* accepted: every training prompt predicted again, `rest` / `full` schedules, ``predictors/v<k>/`` (with
  history.parquet instead of profile.parquet) and the MLflow Model Registry version, as a re-profile writes them.

No policy weights are loaded and no token is generated (report.json: ``source: run``, ``generated_tokens: 0``).

Run: `asp reprofile --from-run` on a stopped run, or in-process from the launch stage with ``drift.action:
refit_from_run`` (`asp.adaptation.launch_drift.resume_after_drift`).
Tests: `.venv/bin/python -m pytest tests/pipeline/test_reprofile.py -q -k refit`, tests/drift/test_refit.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from asp.adaptation.position import check_checkpoint, read_position
from asp.adaptation.reprofile import (
    MIN_EVAL,
    MIN_FIT,
    SOURCE_RUN,
    Attempt,
    ReprofileResult,
    conclude,
    current_predictor_dir,
    finish,
    fit_and_score,
    load_train_prompts,
    split_roles,
)
from asp.adaptation.versions import newest_accepted_version, versions
from asp.config import Params
from asp.schedule.history import HistoryEstimator, LengthHistory
from asp.steps.loaders import load_trained_predictor
from asp.steps.paths import LaunchPaths
from asp.tracking import Tracker

ACTION = "refit_from_run"


def history_targets(history: LengthHistory, version: int, drift_per_version: float) -> pd.DataFrame:
    """Each recorded prompt's current mean length estimated from its visits alone.

    Args:
        history: the run's per-prompt realized lengths.
        version: the current policy version (visits are aged from it).
        drift_per_version: delta of the estimator (``runtime.history.drift_per_version``).

    Returns:
        One row per prompt with at least one visit: prompt_id, mean_length (the kappa-0 estimate: visits weighted
        by 1 / (1/n + delta * age)), samples (n summed over the kept visits), visits, newest_version; in the
        history's prompt order.
    """
    ids = list(history.visits)
    if not ids:
        return pd.DataFrame(
            {"prompt_id": [], "mean_length": [], "samples": [], "visits": [], "newest_version": []}
        ).astype({"mean_length": np.float64, "samples": np.int64, "visits": np.int64, "newest_version": np.int64})
    means, counts, ages = history.arrays(ids, version)
    estimator = HistoryEstimator(prior_samples=0.0, drift_per_version=drift_per_version)
    target = history.loads(ids, means[:, 0], version, estimator)  # the prior is unused: kappa 0, all visited
    return pd.DataFrame(
        {
            "prompt_id": ids,
            "mean_length": target.astype(np.float64),
            "samples": counts.sum(axis=1).astype(np.int64),
            "visits": (counts > 0).sum(axis=1).astype(np.int64),
            "newest_version": np.array([max(v for v, _, _ in history.visits[p]) for p in ids], dtype=np.int64),
        }
    )


def choose_recent(targets: pd.DataFrame, limit: int, seed: int) -> pd.DataFrame:
    """The `limit` rows of `targets` whose newest visit is most recent (a seeded random order among equal
    versions), in that order; all of them when there are fewer."""
    order = np.random.default_rng(seed).permutation(len(targets))
    shuffled = targets.iloc[order]
    ranked = shuffled.sort_values("newest_version", ascending=False, kind="stable")
    return ranked.head(limit).reset_index(drop=True)


def refit_from_run(
    params: Params, state_dir: Path, tracker: Tracker, *, reason: str = "manual", paths: LaunchPaths | None = None
) -> ReprofileResult:
    """Fine-tune the predictor on the stopped run's own realized lengths (see the module docstring) and, when the
    held-out tau passes the gate, re-schedule as a re-profile does; returns what was done.

    Raises:
        UserError: no runtime checkpoint, a finished run, missing pipeline outputs.
    """
    t0, state_dir, paths = time.perf_counter(), Path(state_dir), paths or LaunchPaths()
    check_checkpoint(state_dir)  # before any other file is read
    prompts = load_train_prompts(paths.prompts)
    texts_by_id = dict(zip(prompts["prompt_id"], prompts["prompt"], strict=True))
    position = read_position(params, paths, state_dir, texts_by_id)
    base = newest_accepted_version(state_dir)
    attempt = Attempt(state_dir, max(versions(state_dir), default=1) + 1, base, reason, position, source=SOURCE_RUN)
    drift, history = params.drift, params.runtime.history
    targets = history_targets(position.history, position.version, history.drift_per_version)
    targets = targets[targets["prompt_id"].isin(texts_by_id)]  # prompts of this run's prompt set only
    need = max(drift.refit_min_prompts, MIN_EVAL + MIN_FIT)
    if len(targets) < need:
        why = (
            "runtime.history.enabled is false, so the run kept none (turn it on, or use drift.action: reprofile)"
            if not history.enabled
            else "train longer before refitting, lower drift.refit_min_prompts, or use drift.action: reprofile"
        )
        msg = (
            f"v{attempt.version} not refitted: the checkpoint holds realized lengths of {len(targets)} prompts, "
            f"drift.refit_min_prompts is {drift.refit_min_prompts}: too little history; {why}. The run keeps the "
            f"schedule of v{base}."
        )
        return finish(params, attempt, tracker, t0, accepted=False, message=msg)
    seed = params.common.seed + 7919 * attempt.version
    chosen = choose_recent(targets, drift.refit_prompts, seed)
    chosen["role"] = split_roles(len(chosen), drift.reprofile_eval_fraction, params.predictor.val_fraction, seed + 1)
    model, tokenizer, meta = load_trained_predictor(current_predictor_dir(state_dir, paths, base), params.predictor)
    field = meta.get("text_field", params.predictor.text_field)
    texts = prompts.set_index("prompt_id").loc[chosen["prompt_id"], field].tolist()
    attempt.seconds = {"profile": 0.0}
    new_pred, true = fit_and_score(params, attempt, chosen, texts, model, tokenizer, seed)
    return conclude(params, attempt, tracker, t0, (model, tokenizer, meta), prompts, field, new_pred, true)
