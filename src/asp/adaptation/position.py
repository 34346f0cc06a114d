"""Where a stopped launch run is: its runtime checkpoint restored (the prompts it has not trained yet, the trainer
step) and the current policy (the checkpoint's trainer weights over the pipeline's policy), for re-profiling.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asp.config import Params
from asp.control.database import Database
from asp.errors import UserError
from asp.schedule.history import LengthHistory
from asp.steps.launch_state import fingerprint_extra
from asp.steps.loaders import policy_model_path
from asp.steps.paths import LaunchPaths
from asp.steps.scheduling import load_plan

WEIGHT_FILE_RE = re.compile(r".*\.(safetensors|bin|pt|pth)(\.index\.json)?$")


@dataclass(frozen=True)
class Position:
    """The checkpointed run: remaining prompt ids in dispatch order, the trainer step and its weights (None: the
    initial policy); the realized lengths of its trained prompts (`runtime.history`; empty when it was off) and the
    policy version they are aged from."""

    pending: list[Any]
    step: int
    weights: Path | None
    history: LengthHistory = field(default_factory=LengthHistory)
    version: int = 0


def pending_prompts(db: Any) -> list[Any]:
    """The Database's remaining prompts in dispatch order (`Database.pending_prompts`)."""
    if hasattr(db, "pending_prompts"):
        return list(db.pending_prompts())
    return [pid for t in db.pending for pid in db.plan.minibatches[db.tasks[t].rank][db.tasks[t].start :]]


def check_checkpoint(state_dir: Path) -> None:
    """`UserError` naming `state_dir` when it holds no runtime checkpoint."""
    if not (state_dir / "runtime_state.json").is_file():
        raise UserError(
            f"{state_dir}: no runtime checkpoint (runtime_state.json). Re-profiling needs a stopped launch run; "
            "run the launch stage first or pass --state-dir outputs/launch_state/<condition>."
        )


def read_position(params: Params, paths: LaunchPaths, state_dir: Path, prompts_by_id: dict[Any, str]) -> Position:
    """Restore the run's Database from the runtime checkpoint in `state_dir`.

    Raises:
        UserError: no checkpoint, a checkpoint of other params, or a finished run (nothing left to re-schedule).
    """
    from asp.runtime import RuntimeConfig, make_checkpointer

    check_checkpoint(state_dir)
    plan = load_plan(params, paths)
    config = RuntimeConfig.from_params(params)
    state, reason = make_checkpointer(plan, config, state_dir, fingerprint_extra(params.runtime)).load()
    if state is None:
        what = "the run finished: nothing left to re-schedule" if "finished" in reason else reason
        raise UserError(f"{state_dir / 'runtime_state.json'}: {what}; re-profiling applies to a stopped run.")
    db = Database(
        plan,
        prompts_by_id,
        epochs=None if config.iterations else 1,
        max_attempts=config.control.max_attempts,
        seed=config.seed,
    )
    db.restore(state["database"])
    ckpt = (state.get("trainer_state") or {}).get("checkpoint")
    weights = Path(ckpt) / "model.safetensors" if ckpt else None
    if weights is None or not weights.is_file():
        from asp.trainers.heldout import final_weights

        final = final_weights(state_dir)
        weights = final[0] if final is not None and final[1] <= int(state["trainer_step"]) else None
    version = int(state.get("policy_version", state["trainer_step"]))
    return Position(pending_prompts(db), int(state["trainer_step"]), weights, db.history, version)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@contextlib.contextmanager
def current_policy(policy_dir: Path, weights: Path | None, work: Path) -> Iterator[Path]:
    """A Hugging Face model directory of the current policy: the policy checkpoint itself, or (trainer weights
    given) a temporary directory under `work` with its config and tokenizer files and `weights` as
    model.safetensors (hard links where possible), removed afterwards."""
    base = policy_model_path(policy_dir)
    if weights is None:
        yield base
        return
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".policy-", dir=work) as tmp:
        for f in base.iterdir():
            if f.is_file() and not WEIGHT_FILE_RE.fullmatch(f.name):
                _link_or_copy(f, Path(tmp) / f.name)
        _link_or_copy(weights, Path(tmp) / "model.safetensors")
        yield Path(tmp)
