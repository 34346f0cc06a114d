"""The simulator checked against a launch: the metrics both report and their relative errors (pure), written once
for `asp simulate`'s check against the last launch (`asp.cli.simulate`) and the `sim_check` stage
(`asp.pipeline.sim_check`).

    launch_errors(simulated, measured)  # [(key, label, measured, simulated, (simulated - measured) / measured)]
    token_split(metrics)                # generation time per minibatch = tokens per minibatch x time per token
    with_token_split(metrics)           # the metrics with those two added

Tests: tests/pipeline/test_simulate.py, tests/pipeline/test_sim_check.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# metric key (``runtime/summary/<key>`` in a launch's metrics) -> label; the first three are the time rows of asp's
# 15 % goal
CHECKED = {
    "mean_iteration_time_s": "mean iteration time (s)",
    "generation_time_mean_s": "generation time / minibatch (s)",
    "tokens_per_minibatch": "generated tokens / minibatch",
    "generation_time_per_token_s": "generation time / token (s)",
    "train_step_mean_s": "training time / step (s)",
    "generation_utilization": "generation utilisation",
    "policy_lag_mean": "policy lag mean (steps)",
    "depth_at_arrival_batches_mean": "queue depth at arrival (batches)",
    "padding_rate_mean": "padding rate",
}
TIME_KEYS = ("mean_iteration_time_s", "generation_time_mean_s", "train_step_mean_s")
SUMMARY = "runtime/summary/"  # where a launch (and a simulated run) reports them
# the two factors of generation time per minibatch, derived from what a run reports (`token_split`)
SPLIT_INPUTS = ("generation_time_mean_s", "tokens_per_s", "wall_s", "minibatches")


def token_split(metrics: Mapping[str, float], prefix: str = SUMMARY) -> dict[str, float]:
    """Generation time per minibatch split into its two factors (pure): ``<prefix>tokens_per_minibatch`` (the
    generated tokens of the trained minibatches, ``tokens_per_s`` x ``wall_s`` over ``minibatches``) and
    ``<prefix>generation_time_per_token_s`` (``generation_time_mean_s`` over that). A simulated generation time off
    by the first is the lengths the run drew or kept (its length model, which minibatches a lag bound dropped); by the
    second, the time model. Empty when an input is missing or there is no minibatch or token."""
    values = [metrics.get(prefix + key) for key in SPLIT_INPUTS]
    if any(v is None for v in values):
        return {}
    gen, rate, wall, minibatches = (float(v) for v in values if v is not None)
    tokens = rate * wall / minibatches if minibatches > 0 else 0.0
    if not tokens > 0:
        return {}
    return {prefix + "tokens_per_minibatch": tokens, prefix + "generation_time_per_token_s": gen / tokens}


def with_token_split(metrics: Mapping[str, float], prefix: str = SUMMARY) -> dict[str, float]:
    """`metrics` with `token_split`'s two factors added (pure)."""
    return {**metrics, **token_split(metrics, prefix)}


def launch_errors(
    simulated: Mapping[str, float],
    measured: Mapping[str, float],
    keys: Iterable[str] = CHECKED,
    simulated_prefix: str = SUMMARY,
) -> list[tuple[str, str, float, float, float]]:
    """(key, label, measured, simulated, relative error) for each of `keys` (of `CHECKED`) that both hold: measured
    as ``runtime/summary/<key>``, simulated as ``<simulated_prefix><key>`` (a simulated run's own metrics by default;
    the simulate stage's file has ``simulate/<condition>/<key>``); error NaN where measured is 0."""
    measured, simulated = with_token_split(measured), with_token_split(simulated, simulated_prefix)
    rows = []
    for key in keys:
        m, s = measured.get(SUMMARY + key), simulated.get(simulated_prefix + key)
        if m is None or s is None:
            continue
        m, s = float(m), float(s)
        rows.append((key, CHECKED[key], m, s, (s - m) / m if m else float("nan")))
    return rows
