"""The launch stage's state directory (``outputs/launch_state/<condition>/``, kept by DVC between runs) and how a rerun
picks the run up: resume it, finish what a kill left undone at its end, or start afresh in the same MLflow run.

Besides the runtime checkpoint (`asp.runtime.checkpoint`), the runtime's run log (`asp.runtime.runlog`) and the GRPO
trainer's checkpoints, the directory holds:

* ``mlflow_run.json`` (`RUN_FILE`): the MLflow run of the run in this directory; ``fresh`` is the checkpoint
  fingerprint of a run that started fresh (to continue its MLflow run when it was killed before its first position);
* ``iterations.jsonl`` (`HISTORY_FILE`): every step's metrics as it finished, for watching a run (the outputs take the
  whole run from the run log, which holds only the steps a position covers).

What a rerun does (`resume_run_id` says which MLflow run it continues):

* an unfinished position of the same plan: resume from it (same MLflow run);
* a finished position whose run log was not closed (killed between the last step and the end of the stage's own
  work: the held-out evaluation, the outputs): no step is trained; the stage finishes that work (same MLflow run);
* otherwise a fresh run: in the MLflow run of a fresh attempt of the same plan killed before its first position, if
  there is one, else a new one.

`fingerprint_extra` says what a runtime checkpoint must match besides the plan (the launch stage and re-profiling
both restore it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from asp.config import RuntimeParams
from asp.io import atomic_path, read_json, read_json_lines, write_json
from asp.progress import progress_bar
from asp.runtime.checkpoint import FILENAME
from asp.runtime.runlog import RunLog

RUN_FILE = "mlflow_run.json"  # the MLflow run a resumed launch continues
HISTORY_FILE = "iterations.jsonl"  # every iteration's metrics as they finished (all sessions)
# GRPO settings that change neither the learning problem nor the results: a checkpoint stays resumable
# when only these differ (e.g. a smaller micro-batch after running out of memory).
GRPO_OPERATIONAL = (
    "eval_interval",
    "eval_problems",
    "eval_samples",
    "micro_batch_tokens",
    "device",
    "autocast_dtype",
    "num_threads",
    "transport",
    "snapshot_dir",
    "keep_snapshots",
    "keep_checkpoints",
    "max_nan_steps",
    "world_size",  # a sharded (DCP) checkpoint loads on another number of ranks
    "backend",
    "activation_checkpointing",
    "cpu_offload",
)


def fingerprint_extra(runtime: RuntimeParams) -> dict[str, Any]:
    """What a runtime checkpoint must match besides the plan: the mode, the trainer and its learning settings."""
    if runtime.trainer.kind != "grpo":
        return {"trainer": runtime.trainer.kind, "mode": runtime.mode}
    grpo = {k: v for k, v in runtime.grpo.model_dump().items() if k not in GRPO_OPERATIONAL}
    return {"trainer": "grpo", "mode": runtime.mode, "grpo": grpo}


def holds_progress(state_dir: Path) -> bool:
    """Whether `state_dir` (``outputs/launch_state``, or one condition's folder in it) holds an interrupted run's
    resume position: a runtime checkpoint not marked finished, which the next launch of the same plan resumes."""
    files = [state_dir] if state_dir.name == FILENAME else sorted(state_dir.rglob(FILENAME))
    for path in files:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and state.get("finished") is False:
            return True
    return False


def read_history(path: Path, upto_step: int) -> list[dict[str, float]]:
    """Iteration rows recorded so far with step <= `upto_step` (later ones are re-run after a resume)."""
    if upto_step <= 0:
        return []
    return [row for row in read_json_lines(path) if 0 < row.get("step", 0) <= upto_step]


def read_run_file(directory: Path) -> dict[str, Any] | None:
    """``mlflow_run.json`` of `directory` (None when missing or unreadable)."""
    try:
        record = read_json(directory / RUN_FILE)
        return record if isinstance(record, dict) and record.get("run_id") else None
    except (OSError, ValueError):
        return None


def continued_run_id(directory: Path, fingerprint: str, resumable: bool) -> str | None:
    """The MLflow run a launch in `directory` continues: the recorded one when there is a position to resume or
    finish (`resumable`), or when the recorded run started fresh with this `fingerprint` and never reached a
    position (its run log is empty); else None (a new run)."""
    record = read_run_file(directory)
    if record is None:
        return None
    if resumable or (record.get("fresh") == fingerprint and not RunLog(directory).lines()):
        return str(record["run_id"])
    return None


def start_session(directory: Path, fresh: bool, step: int, run_id: str | None, fingerprint: str) -> None:
    """Record this session in `directory`: the MLflow run (``fresh``: the fingerprint of a run started fresh); a
    fresh run drops an old run's trainer checkpoints, snapshots and run log; the watch history is kept up to `step`."""
    directory.mkdir(parents=True, exist_ok=True)
    if run_id:
        previous = read_run_file(directory) or {}
        record = {"run_id": run_id, "fresh": fingerprint if fresh else previous.get("fresh")}
        write_json(record, directory / RUN_FILE)
    if fresh:
        RunLog(directory).reset()
        for sub in ("trainer", "snapshots"):
            shutil.rmtree(directory / sub, ignore_errors=True)
    kept = read_history(directory / HISTORY_FILE, step)
    with atomic_path(directory / HISTORY_FILE) as tmp:
        tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))


class Recorder:
    """`on_iteration` hook: appends each iteration to ``iterations.jsonl`` and reports progress (`asp.progress`): a
    line when the run starts (or resumes at `initial`), every ~10 % of `total` steps, at least every `HEARTBEAT_S`
    between steps, and at the end (`close`), each with the step time, reward and lag; a Prefect run shows them in its
    log (the stage's stderr is forwarded line by line)."""

    HEARTBEAT_S = 30.0

    def __init__(self, path: Path, total: int | None, initial: int = 0) -> None:
        self.path, self.total, self.shown = path, total, initial  # shown: the last step the bar counted
        self.bar = progress_bar(total=total, initial=initial, desc="launch", unit="step", heartbeat_s=self.HEARTBEAT_S)

    def __call__(self, cu: Any, metrics: dict[str, float]) -> None:
        row = {"step": cu.step, **{k: float(v) for k, v in metrics.items()}}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        shown = {"iter": f"{metrics.get('runtime/iteration_time_s', 0):.2f}s"}
        for key, name in (("train/reward_mean", "reward"), ("train/lag_mean", "lag")):
            if key in metrics:
                shown[name] = f"{metrics[key]:.3f}"
        self.bar.set_postfix(shown)
        self.bar.update(max(0, cu.step - self.shown))  # steps retrained after a resume are not counted twice
        self.shown = max(self.shown, cu.step)

    def close(self) -> None:
        """The last progress line: done, or how far the run got."""
        self.bar.close()
