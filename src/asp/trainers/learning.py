"""The learning curve of a GRPO run: held-out reward every `eval_interval` trainer steps, against the step and the
run's elapsed wall-clock, measured after training so that evaluation never slows or times the run.

    from asp.trainers.learning import CurveStore, eval_steps, elapsed_by_step, curve_summary, keep_weights
    keep_weights(state_dir, step)                 # after the trainer checkpoint of an evaluation step (a hard link)
    eval_steps(200, 20)                           # [0, 20, 40, ..., 200]
    elapsed_by_step(iterations)                   # step -> seconds of iteration time up to its end
    curve_summary(points)                         # area under the curve (per step and per second), best, final

How: the trainer writes a checkpoint every `runtime.checkpoint_interval` steps and keeps only the last few; at every
evaluation step (`runtime.grpo.eval_interval` rounded up to a multiple of the checkpoint interval, `curve_interval`)
the driver hard-links that checkpoint's ``model.safetensors`` to ``<state dir>/curve/step-<step>.safetensors``,
which costs no time inside any iteration.
After the last step the launch stage decodes a fixed subset of held-out problems (never training prompts) with
every kept snapshot (step 0: the initial policy) with the same sampling seed, scores them with the run's reward and
records each point in ``curve/curve.json`` as it is measured, so a rerun after a kill evaluates only the missing
steps. A point's wall-clock is the run's elapsed iteration time at that step (the sum of the iterations' times up to
it, over every session of a resumed run), so evaluation seconds never enter it; they are reported apart.
Used by `asp.pipeline.launch` (``learning/...`` metrics, plots/learning_curve.png) and benchmarks/learning.py.
Tests: tests/trainers/test_learning.py, tests/pipeline/test_kill_points.py (a curve across a kill).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

CURVE_DIR = "curve"
CURVE_FILE = "curve.json"


def curve_interval(eval_interval: int, checkpoint_interval: int) -> int:
    """`eval_interval` rounded up to a multiple of `checkpoint_interval` (only checkpointed weights are kept); 0: off.

    Example: curve_interval(20, 10) -> 20; curve_interval(20, 3) -> 21; curve_interval(0, 10) -> 0.
    """
    if eval_interval <= 0:
        return 0
    return -(-eval_interval // checkpoint_interval) * checkpoint_interval


def eval_steps(last_step: int, interval: int) -> list[int]:
    """Steps evaluated in a run that ended at `last_step`: 0, every `interval`-th step and the last one.

    Example: eval_steps(45, 20) -> [0, 20, 40, 45]; eval_steps(40, 20) -> [0, 20, 40]; interval 0 -> [].
    """
    if interval <= 0:
        return []
    steps = list(range(0, max(last_step, 0) + 1, interval))
    if last_step > 0 and steps[-1] != last_step:
        steps.append(last_step)
    return steps


def elapsed_by_step(iterations: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """Step -> the run's elapsed iteration time at the end of that step (seconds; step 0 -> 0).

    The iterations of a whole run (`RunSummary.iterations`, every session); a step recorded twice (retrained after a
    resume) counts once, its last record. Only ``runtime/iteration_time_s`` counts: no evaluation, no downtime
    between sessions.
    """
    times: dict[int, float] = {}
    for it in iterations:
        times[int(it["step"])] = float(it.get("runtime/iteration_time_s", 0.0))
    out, total = {0: 0.0}, 0.0
    for step in sorted(times):
        total += times[step]
        out[step] = total
    return out


def curve_summary(points: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Area under the curve and best point of the evaluations `points` (each ``step``, ``elapsed_s``, ``reward``).

    ``auc_step``: the trapezoid area under reward vs step divided by the steps spanned (the curve's mean reward over
    training; NaN with one point); ``auc_time``: the same over elapsed seconds; ``best``, ``best_step``; ``final``
    (the last step's reward); ``gain`` (final - the first point's); ``evaluations``.
    """
    if not points:
        return {"evaluations": 0}
    pts = sorted(points, key=lambda p: p["step"])
    step = np.asarray([p["step"] for p in pts], dtype=float)
    when = np.asarray([p["elapsed_s"] for p in pts], dtype=float)
    reward = np.asarray([p["reward"] for p in pts], dtype=float)
    best = int(np.argmax(reward))
    return {
        "evaluations": len(pts),
        "auc_step": _mean_area(step, reward),
        "auc_time": _mean_area(when, reward),
        "best": float(reward[best]),
        "best_step": float(step[best]),
        "final": float(reward[-1]),
        "gain": float(reward[-1] - reward[0]),
    }


def _mean_area(x: np.ndarray, y: np.ndarray) -> float:
    span = float(x[-1] - x[0]) if x.size > 1 else 0.0
    if span <= 0:
        return float("nan")
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / span)


# ---- kept weights ---------------------------------------------------------------------------------------
def weights_path(state_dir: str | Path, step: int) -> Path:
    return Path(state_dir) / CURVE_DIR / f"step-{step:08d}.safetensors"


def keep_weights(state_dir: str | Path, step: int) -> Path | None:
    """Hard-link (copy where links fail) the trainer checkpoint of `step` to the curve's weights; None when that
    checkpoint is not (or no longer) there. Replaces an older link of the same step (a retrained step)."""
    source = Path(state_dir) / "trainer" / f"step-{step:08d}" / "model.safetensors"
    if not source.is_file():
        return None
    target = weights_path(state_dir, step)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return target


def keep_checkpointed(state_dir: str | Path, interval: int) -> list[int]:
    """Keep the weights of every trainer checkpoint still on disk whose step is a multiple of `interval` (one a kill
    between the checkpoint and the driver's link left unlinked); returns the steps kept now."""
    from asp.trainers.weights import CHECKPOINT_RE

    root = Path(state_dir) / "trainer"
    if interval <= 0 or not root.is_dir():
        return []
    kept = []
    for path in sorted(root.iterdir()):
        match = CHECKPOINT_RE.match(path.name)
        step = int(match.group(1)) if match else -1
        if step > 0 and step % interval == 0 and not weights_path(state_dir, step).exists():
            kept += [step] if keep_weights(state_dir, step) is not None else []
    return kept


def reset(state_dir: str | Path) -> None:
    """Forget the curve of an earlier run (a fresh run starts its own)."""
    shutil.rmtree(Path(state_dir) / CURVE_DIR, ignore_errors=True)


class CurveStore:
    """``<state dir>/curve/curve.json``: the points measured so far (step -> point) and whether they were logged;
    rewritten atomically after each point."""

    def __init__(self, state_dir: str | Path) -> None:
        from asp.io import read_json

        self.path = Path(state_dir) / CURVE_DIR / CURVE_FILE
        data = read_json(self.path) if self.path.is_file() else {}
        self.points: dict[int, dict[str, float]] = {int(k): dict(v) for k, v in data.get("points", {}).items()}
        self.logged: bool = bool(data.get("logged", False))

    def add(self, point: Mapping[str, float]) -> None:
        self.points[int(point["step"])] = dict(point)
        self._write()

    def mark_logged(self) -> None:
        self.logged = True
        self._write()

    def ordered(self) -> list[dict[str, float]]:
        return [self.points[s] for s in sorted(self.points)]

    def _write(self) -> None:
        from asp.io import write_json

        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json({"points": {str(k): v for k, v in sorted(self.points.items())}, "logged": self.logged}, self.path)
