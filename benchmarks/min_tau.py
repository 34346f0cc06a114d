"""Benchmark: the predictor τ below which the ASP schedule stops beating the original order — `evaluate.min_tau`.

For each length set, the controlled-τ sweep (`asp.schedule.ablation.sweep`, what `asp schedule sweep` runs):
simulated predictions l * exp(ν ε) at each Kendall τ of a fine grid, many seeds (each seed: its own prediction
noise, prompts' order, C4 annealing seed), the pipeline's `schedule:` settings from params.yaml (b, κ, k,
iterations, method). It compares the realized batch-group load CV of C4 balanced on calibrated loads (what the
pipeline builds, `schedule.loads: calibrated`; the isotonic map fitted on a fresh-noise profile of the same
prompts) with C0 (fixed minibatches of b in the prompts' order), paired per seed, and finds the smallest grid τ
down to which C4 beats C0 at every grid point by more than 2 paired standard errors (and by the plain mean).

Length sets: the demo's profiled mean lengths (outputs/profile/prompts.parquet, all profiled prompts; skipped
when the pipeline has not run) and real answer lengths of chat models (data/alpaca_eval_lengths.json, whitespace
words, 805 AlpacaEval instructions; the three targets of issue 21 by default).

    .venv/bin/python benchmarks/min_tau.py                      # 100 seeds: ~11 min on the busy 2 cores
    .venv/bin/python benchmarks/min_tau.py --seeds 10 --taus 1,0.5,0.3,0.2,0  --out sweep.json
    .venv/bin/python benchmarks/min_tau.py --demo '' --targets tulu-2-dpo-7b --cap 1000   # answers cut at 1,000 words

The last lines state the default this measurement implies (the largest crossover over the length sets, so that
a predictor passing the gate helps on every one) and whether params.yaml's `evaluate.min_tau` agrees. A length
set on which C4 does not beat C0 even with oracle predictions is named and left out: its longest answers outweigh
a whole batch group (the ratio printed), which no predictor can fix.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "alpaca_eval_lengths.json"
DEMO_PROFILE = ROOT / "outputs" / "profile" / "prompts.parquet"
TARGETS = ("Qwen1.5-7B-Chat", "phi-2-sft", "tulu-2-dpo-7b")
TAUS = (1.0, 0.8, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.1, 0.0)
Z = 2.0


def length_sets(
    data: Path, targets: list[str], unit: str, demo: Path | None, cap: float | None = None
) -> dict[str, np.ndarray]:
    """name -> true lengths (>= 1): the demo profile's mean lengths (if there) and each target's real lengths,
    these clipped at `cap` (a generation-length limit, as an RL run has) when given."""
    sets: dict[str, np.ndarray] = {}
    if demo is not None:
        if demo.is_file():
            import pandas as pd

            sets["demo (profiled mean tokens)"] = pd.read_parquet(demo, columns=["mean_length"])[
                "mean_length"
            ].to_numpy(np.float64)
        else:
            print(f"{demo}: missing (run `dvc repro profile`), so no demo row", file=sys.stderr)
    if targets:
        rows = json.loads(data.read_text())["rows"]
        for t in targets:
            x = np.asarray([r[f"{unit}:{t}"] for r in rows], dtype=np.float64)
            sets[f"{t} ({unit}{f', capped at {cap:g}' if cap else ''})"] = np.minimum(x, cap) if cap else x
    return {name: np.maximum(x, 1.0) for name, x in sets.items()}


def crossover(gain: Any, z: float) -> tuple[float | None, float | None]:
    """(smallest grid τ down to which gain > z * se at every grid τ, the next τ below it)."""
    lowest = None
    for tau, row in gain.iterrows():  # descending τ
        if not row["gain"] > z * row["se"]:
            return lowest, float(tau)
        lowest = float(tau)
    return lowest, None


def tail_ratio(true: np.ndarray, spec: Any) -> float:
    """Load of the b longest prompts over the mean batch group's load (n / (b k) groups): above about 1 the
    sorted minibatch holding the longest answers outweighs a whole group, and no order of minibatches can even
    the groups out (sorting concentrates the tail that C0 spreads)."""
    top = np.sort(true)[::-1][: spec.b].sum()
    return float(top / (true.sum() * spec.b * spec.k / true.size))


def measure(true: np.ndarray, spec: Any, taus: list[float], seeds: int) -> dict[str, Any]:
    """Sweep one length set; the CV table, the paired gain of C4_cal over C0 and both crossovers."""
    from asp.schedule.ablation import sweep

    t0 = time.perf_counter()
    res = sweep(true, spec, taus=taus, seeds=list(range(seeds)))
    gain = res.gain("C4_cal", "C0")
    return {
        "n": int(true.size),
        "seconds": time.perf_counter() - t0,
        "cv": res.cv,
        "gain": gain,
        "mean_crossover": res.stops_helping("C4_cal", "C0"),
        "z_crossover": crossover(gain, Z),
        "tail_ratio": tail_ratio(true, spec),
    }


def markdown(name: str, m: dict[str, Any]) -> str:
    """One length set's table: τ | C0 CV | C4 (calibrated) CV | gain ± SE | C4 (raw loads) CV."""
    lines = [
        f"**{name}**, n = {m['n']}; the b longest prompts' load / a mean group's load {m['tail_ratio']:.2f} "
        f"({m['seconds']:.0f} s)",
        "",
        "| τ | C0 CV | C4 CV (calibrated loads) | C0 − C4 (± SE) | C4 CV (raw loads) |",
        "|---|---|---|---|---|",
    ]
    cv, gain = m["cv"], m["gain"]
    for tau in gain.index:
        g = gain.loc[tau]
        lines.append(
            f"| {tau:g} | {cv.at[tau, 'C0']:.4f} | {cv.at[tau, 'C4_cal']:.4f} | {g['gain']:+.4f} ± {g['se']:.4f} "
            f"| {cv.at[tau, 'C4']:.4f} |"
        )
    return "\n".join(lines)


def fmt(pair: tuple[float | None, float | None]) -> str:
    lowest, below = pair
    if lowest is None:
        return "nowhere"
    return f"τ ≥ {lowest:g}" + (f" (not at {below:g})" if below is not None else " (whole grid)")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from asp.config import load_params
    from asp.steps.scheduling import schedule_spec

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="alpaca_eval_lengths.json")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated models ('' for none)")
    ap.add_argument("--unit", choices=("words", "chars"), default="words")
    ap.add_argument("--cap", type=float, default=None, help="clip real lengths at this (a generation-length limit)")
    ap.add_argument("--demo", default=str(DEMO_PROFILE), help="profile prompts.parquet ('' for none)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="schedule settings and min_tau")
    ap.add_argument("--iterations", type=int, default=None, help="annealing proposals (default: params')")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--taus", default=",".join(map(str, TAUS)), help="comma-separated Kendall τ grid")
    ap.add_argument("--out", type=Path, default=None, help="also write the tables as JSON")
    a = ap.parse_args(argv)

    params = load_params(a.params)
    spec = schedule_spec(params.schedule)
    if a.iterations is not None:
        spec = replace(spec, iterations=a.iterations)
    taus = sorted({float(t) for t in a.taus.split(",") if t.strip()}, reverse=True)
    targets = [t for t in a.targets.split(",") if t.strip()]
    sets = length_sets(a.data, targets, a.unit, Path(a.demo) if a.demo else None, a.cap)
    print(
        f"schedule: b {spec.b}, κ {spec.kappa}, k {spec.k}, {spec.iterations} iterations, {spec.method}; "
        f"{a.seeds} seeds per τ; C4 balanced on calibrated loads vs C0, realized group-load CV\n"
    )
    results = {}
    for name, true in sets.items():
        results[name] = measure(true, spec, taus, a.seeds)
        print(markdown(name, results[name]) + "\n", flush=True)
    print("| length set | n | longest b / mean group load | C4 beats C0 (mean CV) | C4 beats C0 by > 2 SE |")
    print("|---|---|---|---|---|")
    for name, m in results.items():
        print(f"| {name} | {m['n']} | {m['tail_ratio']:.2f} | {fmt(m['mean_crossover'])} | {fmt(m['z_crossover'])} |")
    balanceable = {name: m for name, m in results.items() if m["z_crossover"][0] is not None}
    for name, m in results.items():
        if name not in balanceable:
            print(
                f"\n{name}: C4 does not beat C0 even with oracle predictions (τ = {max(taus):g}): its b longest "
                f"prompts carry {m['tail_ratio']:.2f}x a mean group's load, so the sorted minibatch that holds them "
                "outweighs any group and no predictor fixes that (a length cap, more prompts or a larger k does); "
                "left out of the default."
            )
    implied = max((m["z_crossover"][0] for m in balanceable.values()), default=None)
    current = params.evaluate.min_tau
    if implied is None:
        print("\nno default implied: C4 beats C0 by 2 SE at the top of the grid on no length set")
    else:
        verdict = "agrees" if abs(implied - current) < 1e-9 else "differs"
        print(
            f"\nimplied evaluate.min_tau = {implied:g}: the largest, over the length sets where balancing can help, "
            f"of the smallest τ down to which C4 beats C0 by 2 paired SE at every grid τ; {a.params.name} has "
            f"{current:g}: {verdict}"
        )
    if a.out is not None:
        from asp.io import write_json

        write_json(
            {
                "spec": spec.kwargs(),
                "seeds": a.seeds,
                "implied_min_tau": implied,
                "sets": {
                    name: {
                        "n": m["n"],
                        "cv": m["cv"].reset_index().to_dict(orient="records"),
                        "gain": m["gain"].reset_index().to_dict(orient="records"),
                        "mean_crossover": m["mean_crossover"],
                        "z_crossover": m["z_crossover"],
                        "tail_ratio": m["tail_ratio"],
                    }
                    for name, m in results.items()
                },
            },
            a.out,
        )
    return {"implied": implied, "results": results}


if __name__ == "__main__":
    main()
