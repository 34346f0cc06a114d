"""Where the length-aware schedule stops helping, and what the evaluate stage's τ gate tells a user below it.

`evaluate.min_tau` is the predictor's held-out Kendall τ below which the balanced ASP schedule (C4, on calibrated
loads as the pipeline builds it) no longer has a lower batch-group load CV than the original order (C0), measured
with the controlled-τ sweep (`asp schedule sweep`, `asp.schedule.ablation.sweep`) on the demo's profiled lengths
and on real answer lengths (data/alpaca_eval_lengths.json) at the pipeline's `schedule:` settings:

    .venv/bin/python benchmarks/min_tau.py          # prints each data set's crossover and the default it implies

`describe_crossover` words a sweep's crossover (the CLI prints it under the sweep); `gate_message` is the gate's
failure message (`asp.pipeline.evaluate.gate`). Run the checks: `.venv/bin/python -m pytest
tests/schedule/test_min_tau.py -q`.
"""

from __future__ import annotations

from typing import Any

SIGNIFICANCE_Z = 2.0  # "beats by more than 2 paired standard errors over seeds"


def describe_crossover(result: Any, seeds: int, condition: str = "C4_cal", baseline: str = "C0") -> str:
    """One or two sentences: the grid τ down to which `condition` has a lower mean group-load CV than
    `baseline`, and (with 2+ seeds) down to which it does so by more than `SIGNIFICANCE_Z` paired standard errors.

    Args:
        result: a `SweepResult`.
        seeds: the number of seeds it averaged over.
    """
    lowest, below = result.stops_helping(condition, baseline)
    what = f"{condition} (balanced{' on calibrated loads' if condition == 'C4_cal' else ''}) vs {baseline}:"
    if lowest is None:
        text = f"{what} no lower group-load CV even at the largest tau ({below:g})"
    else:
        where = f"every tau >= {lowest:g} (not at {below:g}; " if below is not None else "every tau of the grid ("
        text = f"{what} lower group-load CV at {where}means over {seeds} seeds)"
    if seeds > 1:
        sig, sig_below = result.stops_helping(condition, baseline, z=SIGNIFICANCE_Z)
        if sig is None:
            text += f"; by more than {SIGNIFICANCE_Z:g} paired standard errors nowhere down from {sig_below:g}"
        else:
            text += f"; by more than {SIGNIFICANCE_Z:g} paired standard errors at every tau >= {sig:g}"
    return text + "."


def gate_message(tau: float, min_tau: float) -> str:
    """The evaluate stage's message for a held-out τ below `evaluate.min_tau`: what the threshold means and what
    to do about it."""
    return (
        f"held-out Kendall tau {tau:.3f} is below evaluate.min_tau = {min_tau:g}. Below about this tau the ASP "
        "schedule stops paying off: its balanced batch groups (C4) no longer even out group loads better than the "
        "prompts' original order (C0) (min_tau's default is that crossover, measured with `asp schedule sweep` on "
        "the demo's and on real answer lengths: benchmarks/min_tau.py; `asp schedule sweep <your lengths> --b B "
        "--k K` measures it for your own). What to do: give the predictor more to learn from (more profiled "
        "prompts, prepare.profile_prompts; a prompt field that carries the task, predictor.text_field / "
        "max_length), train longer (predictor.epochs, predictor.patience); or, to go on with this predictor, set "
        "evaluate.on_fail: warn (the schedule is still built, but expect little gain over the original order) or "
        "lower evaluate.min_tau if a sweep on your lengths shows the schedule still helps there."
    )
