"""The paper's schedule conditions C0-C4 (§5.3) as dispatchable `Schedule`s, for runtime studies (Table 4(b)).

    C0  fixed-size minibatches of b prompts in the dataset's original order
    C1  prompts sorted by their load, fixed size b
    C2  the same sorted order cut into DP minibatches (sizes in [b, b + kappa]), dispatched short to long
    C3  C2's minibatches in a seeded random order
    C4  C2's minibatches in balanced batch groups (the ASP schedule, `build_schedule`)

C1-C4 all see the same numbers: the loads of `expected_lengths` (calibrated expected lengths, or the raw
predictions with `loads="raw"`), sorted by (load, prediction, row) as `build_schedule` sorts them; so C1 and C2
differ only in how the sorted order is cut, and C2-C4 only in how its minibatches are ordered. With a monotone
calibration map (what the evaluate stage fits) this is the order of the raw predictions; with per-prompt loads
(the ablation's cross-fitted ones) it is the order of those loads.

`ablation` measures these on true lengths; this module builds them so the runtime can execute them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asp.schedule.dp import fixed_minibatches
from asp.schedule.schedule import Schedule, assemble, build_schedule, expected_lengths, plan_minibatches
from asp.schedule.validate import as_choice, as_int, as_lengths

CONDITION_NAMES = ("C0", "C1", "C2", "C3", "C4")


def condition_schedule(
    prompt_ids: object,
    predicted_lengths: object,
    condition: str,
    *,
    b: int,
    kappa: int,
    k: int,
    seed: int,
    calibration: Any = None,
    loads: str | None = None,
    **balance: Any,
) -> Schedule:
    """Build the schedule of one condition C0..C4 over the given prompts.

    Args:
        prompt_ids, predicted_lengths: (n,) as in `build_schedule`.
        condition: "C0" .. "C4".
        b, kappa, k, seed, calibration, loads: as in `build_schedule` (C0/C1 use fixed size b).
        **balance: C4 only: iterations and method (both required for C4), shuffle (see `build_schedule`).

    Returns:
        A `Schedule` whose `info["condition"]` names the condition.
    """
    condition = as_choice(condition, "condition", CONDITION_NAMES)
    if condition == "C4":
        s = build_schedule(
            prompt_ids,
            predicted_lengths,
            b=b,
            kappa=kappa,
            k=k,
            seed=seed,
            calibration=calibration,
            loads=loads,
            **balance,
        )
        s.info["condition"] = "C4"
        return s
    predicted = as_lengths(predicted_lengths, "predicted_lengths")
    ids = np.asarray(prompt_ids)
    if ids.shape != predicted.shape:
        raise ValueError(f"prompt_ids has shape {ids.shape} but predicted_lengths has {predicted.shape[0]} values")
    b, k, seed = as_int(b, "b", minimum=1), as_int(k, "k", minimum=1), as_int(seed, "seed", minimum=0)
    expected, mode = expected_lengths(predicted, calibration, loads)
    if condition == "C0":
        order, endpoints = np.arange(ids.size), fixed_minibatches(ids.size, b)
    elif condition == "C1":  # C2-C4's sort (plan_minibatches), cut every b prompts
        order = np.lexsort((np.arange(ids.size), predicted, expected))
        endpoints = fixed_minibatches(ids.size, b)
    else:
        order, endpoints, _ = plan_minibatches(predicted, expected, b, as_int(kappa, "kappa", minimum=0))
    n_mb = endpoints.size - 1
    perm = np.random.default_rng([seed, 0xC3]).permutation(n_mb) if condition == "C3" else np.arange(n_mb)
    positions, offsets = assemble(order, endpoints, perm)
    info = {"condition": condition, "b": b, "kappa": kappa, "loads": mode, "seed": seed}
    return Schedule(
        ids[positions], positions, offsets, perm.astype(np.int64), predicted[positions], expected[positions], k, info
    )
