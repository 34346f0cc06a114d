"""DVC stage `sim_check`: the simulator checked against the launch it predicted, on every pipeline run.

The `simulate` stage runs before `launch` in the DAG (both follow `schedule`), so it cannot read the launch: reading
it would be an undeclared dependency, or would make `dvc repro simulate` run the launch. This stage follows both and
compares them for the launch's condition (``runtime.condition``): mean iteration time, generation time per
minibatch, training time per step, policy lag, queue depth at arrival and padding, measured (metrics/launch.json,
``runtime/summary/<metric>``) against simulated (metrics/simulate.json, ``simulate/<condition>/<metric>``), each
with its relative error, and whether the measured iteration time lies inside the range the sharing probe's spread
gives (``simulate/<condition>/mean_iteration_time_s_probe_low`` / ``_high``, when the probe kept its rounds).
Generation utilisation is left to `asp simulate` (the CLI): the stage's ``simulate/<condition>/generation_utilization``
is the simulator's own duty-cycle measure, not the launch's Σ generation time / (actors × wall).

Both files come from the same params (dvc.yaml gives this stage both stages' params), so they describe the same
setting unless ``simulate.iterations`` cut the simulated run short or ``simulate.time_model`` is a GPU preset; then,
or with simulate disabled or the launch's condition not among ``simulate.conditions``, there is nothing to check:
``sim_check/checked`` is 0 and the stage says why. It never fails on a large error: it reports it
(``sim_check/max_time_error``: the largest absolute error of the three time rows, against asp's 15 % goal;
``sim_check/<metric>_error``, ``_measured`` and ``_simulated`` per metric). Beside the table it names what says the
time model was timed on an unsteady machine, which moves the simulated times (`clock_doubts`: the sharing probe's
calls of one engine alone far from the profile's fit, or the profile's speed drifting while it was timed; both kept
as ``sim_check/probe_clock`` and ``sim_check/speed_drift``), with how to time them again: the simulate stage warns of
the same, but a user reading only this check would otherwise see a large error without its cause. Beyond the goal
with neither, it names the day the sharing probe in use was timed (metrics/sharing_probe.json's ``date``) and says
to probe the launch's sitting: a committed probe's slowdowns are another sitting's, and so is its trainer step where
the trainer_alone stage did not time one in this sitting (``sim_check/trainer_alone_s`` when it did;
docs/simulator.md).

Writes metrics/sim_check.json and logs the same to the stage's MLflow run.

Run: `asp stage sim_check` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from asp.config import Params
from asp.errors import UserError
from asp.io import read_json, write_json
from asp.sim.sharing import probe_clock_doubtful
from asp.sim.timemodel import drift_doubtful
from asp.steps.launch_check import CHECKED, TIME_KEYS, launch_errors
from asp.steps.paths import SimCheckPaths as Paths
from asp.tracking import Tracker

# the metrics compared: `launch_check.CHECKED` but generation utilisation (see the module docstring)
KEYS = tuple(k for k in CHECKED if k != "generation_utilization")
GOAL = 0.15  # asp's validation goal on the time rows (docs/simulator.md)


def nothing_to_check(params: Params, simulated: dict[str, Any]) -> str | None:
    """Why the simulated and the measured run are not the same setting (pure), or None when they are."""
    condition = params.runtime.condition
    if not simulated.get("simulate/enabled"):
        return "simulate.enabled is false, or the simulate stage skipped (no timed profile): nothing was simulated"
    if params.simulate.time_model != "fit":
        return (
            f"simulate.time_model is the preset {params.simulate.time_model} (published GPU/NPU times), not this "
            "machine's"
        )
    if f"simulate/{condition}/mean_iteration_time_s" not in simulated:
        return f"the launch ran {condition}, which simulate.conditions does not simulate: add it to check it"
    iterations = params.simulate.iterations
    if iterations is not None and iterations != params.runtime.iterations:
        return (
            f"simulate.iterations ({iterations}) cut the simulated run short of the launch's runtime.iterations "
            f"({params.runtime.iterations})"
        )
    return None


def compare(condition: str, simulated: dict[str, Any], measured: dict[str, Any]) -> dict[str, float]:
    """``sim_check/max_time_error`` (the time rows present), ``sim_check/iteration_in_probe_range`` (1/0, when the
    simulated file has the probe's range), then ``sim_check/<metric>_error``, ``_measured`` and ``_simulated`` for
    each of `KEYS` both files hold (`asp.steps.launch_check.launch_errors`; no error where measured is 0); pure."""
    rows = launch_errors(simulated, measured, KEYS, simulated_prefix=f"simulate/{condition}/")
    pairs = {key: (m, s) for key, _, m, s, _ in rows}
    errors = {key: err for key, _, m, _, err in rows if m}
    out: dict[str, float] = {"sim_check/checked": 1.0}
    times = [abs(e) for key, e in errors.items() if key in TIME_KEYS]
    if times:
        out["sim_check/max_time_error"] = max(times)
    low = simulated.get(f"simulate/{condition}/mean_iteration_time_s_probe_low")
    high = simulated.get(f"simulate/{condition}/mean_iteration_time_s_probe_high")
    if low is not None and high is not None and "mean_iteration_time_s" in pairs:
        out["sim_check/iteration_in_probe_range"] = float(
            float(low) <= pairs["mean_iteration_time_s"][0] <= float(high)
        )
    out.update({f"sim_check/{key}_error": e for key, e in errors.items()})
    for key, (m, s) in pairs.items():
        out.update({f"sim_check/{key}_measured": m, f"sim_check/{key}_simulated": s})
    # how steadily the time model was timed (`clock_doubts`), and whether the trainer's step alone is this sitting's
    for key in ("probe_clock", "speed_drift", "trainer_alone_s"):
        if isinstance(value := simulated.get(f"simulate/gen_fit/{key}"), int | float):
            out[f"sim_check/{key}"] = float(value)
    return out


def clock_doubts(metrics: dict[str, float], trainer: str) -> list[str]:
    """What says the simulated times were fitted on timings of an unsteady machine (pure):
    the sharing probe's calls of one engine alone too far from the profile's fit (`probe_clock_doubtful`)
    (``probe_clock``: two timings of the same engine disagree), or the profile's speed drifting more than
    `asp.sim.timemodel.DRIFT_WARN` while it was timed (``speed_drift``). The second moves every simulated time by
    about as much; the first moves a GRPO `trainer`'s step only, and none where the trainer_alone stage timed that
    step in this sitting (``trainer_alone_s``)."""
    doubts = []
    clock = metrics.get("sim_check/probe_clock")
    if probe_clock_doubtful(clock, trainer, "sim_check/trainer_alone_s" in metrics):
        doubts.append(
            f"the sharing probe's calls of one engine alone ran {clock:.2f}x what the profile's fit predicts "
            "(simulate/gen_fit/probe_clock): the two timed the same engine at different speeds"
        )
    drift = metrics.get("sim_check/speed_drift")
    if drift is not None and drift_doubtful(drift):
        doubts.append(
            f"the machine's speed moved {100 * drift:.0f} % while the profile was timed (simulate/gen_fit/speed_drift)"
        )
    return doubts


def report(condition: str, metrics: dict[str, float], probe_date: str | None = None, trainer: str = "grpo") -> str:
    """The check as a Markdown table, the largest time error against `GOAL`, and what to do about a large one: the
    time model's `clock_doubts` (a `trainer` of ``runtime.trainer.kind``), or else, beyond the goal with a sharing
    probe in use (timed on `probe_date`), probing in the launch's sitting (pure)."""
    lines = [
        f"simulated against the launch ({condition}):",
        "| metric | measured | simulated | error |",
        "|---|---|---|---|",
    ]
    for key in KEYS:
        if f"sim_check/{key}_measured" in metrics:
            m, s = metrics[f"sim_check/{key}_measured"], metrics[f"sim_check/{key}_simulated"]
            e = metrics.get(f"sim_check/{key}_error")
            lines.append(f"| {CHECKED[key]} | {m:.4g} | {s:.4g} | {'n/a' if e is None else f'{100 * e:+.1f} %'} |")
    if "sim_check/max_time_error" in metrics:
        worst = metrics["sim_check/max_time_error"]
        verdict = "within" if worst <= GOAL else "beyond"
        lines.append(f"largest error on the time rows: {100 * worst:.1f} % ({verdict} the {100 * GOAL:.0f} % goal)")
    if "sim_check/iteration_in_probe_range" in metrics:
        inside = "inside" if metrics["sim_check/iteration_in_probe_range"] else "outside"
        lines.append(f"the measured iteration time is {inside} the range the sharing probe's spread gives")
    if doubts := clock_doubts(metrics, trainer):
        lines.append(
            "the simulated times rest on timings of an unsteady machine, which move them: "
            + "; ".join(doubts)
            + ". Time both again on an idle machine, one after the other (dvc repro -f -s profile, then asp simulate "
            "probe-sharing), then dvc repro"
        )
    elif probe_date and metrics.get("sim_check/max_time_error", 0.0) > GOAL:
        what = (
            "its slowdowns are"  # the step timed in this sitting (the trainer_alone stage), or a simulated trainer
            if "sim_check/trainer_alone_s" in metrics or trainer != "grpo"
            else "its slowdowns (and a GRPO trainer's step alone) are"
        )
        lines.append(
            f"the sharing probe in use was timed on {probe_date}: {what} that sitting's, and this machine's speed "
            "moves between sittings. Probe this one on an idle machine (asp simulate probe-sharing), then compare "
            f"again: asp simulate -c {condition}"
        )
    return "\n".join(lines)


def probe_date(path: Path, simulated: dict[str, Any], condition: str) -> str | None:
    """The day the sharing probe at `path` was timed (its ``date``) when the simulated run used it (its clock or its
    range is in `simulated`), else None; a probe that cannot be read says nothing here (simulate names it)."""
    keys = (f"simulate/{condition}/mean_iteration_time_s_probe_low", "simulate/gen_fit/probe_clock")
    used = any(key in simulated for key in keys)
    try:
        date = read_json(path).get("date") if used else None
    except (OSError, ValueError, AttributeError):
        return None
    return date if isinstance(date, str) else None


def _read(path: Path, stage: str) -> dict[str, Any]:
    """A stage's metrics file, or a UserError naming it."""
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise UserError(f"{path}: not found; run the {stage} stage first (dvc repro {stage})") from None
    except ValueError as exc:
        raise UserError(f"{path}: not JSON ({exc}); run the {stage} stage again (dvc repro -f -s {stage})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a metrics file; run the {stage} stage again (dvc repro -f -s {stage})")
    return data


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Compare the simulated and the measured launch (see the module docstring); write and log the metrics."""
    simulated, measured = _read(paths.simulate_metrics, "simulate"), _read(paths.launch_metrics, "launch")
    condition = params.runtime.condition
    tracker.log_params({"runtime.condition": condition, "simulate.time_model": params.simulate.time_model})
    why = nothing_to_check(params, simulated)
    if why is not None:
        metrics: dict[str, Any] = {"sim_check/checked": 0.0}
        print(f"[sim_check] nothing to check: {why}", file=sys.stderr, flush=True)
    else:
        metrics = compare(condition, simulated, measured)
        when = probe_date(paths.sharing_probe, simulated, condition)
        print(
            f"[sim_check] {report(condition, metrics, when, params.runtime.trainer.kind)}", file=sys.stderr, flush=True
        )
    write_json(metrics, paths.metrics)
    tracker.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)})
    return metrics
