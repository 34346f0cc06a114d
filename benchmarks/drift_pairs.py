"""The drift detector's defaults (params.yaml `drift.*`) scored on every ordered pair of the 14 real models of
data/alpaca_eval_lengths.json, not only on phi-2-sft -> phi-2-dpo, where they were tuned (issue 36).

    .venv/bin/python benchmarks/drift_pairs.py                       # 14 models, 182 pairs (~5 min on 2 cores)
    .venv/bin/python benchmarks/drift_pairs.py --splits 1 --windows 200 --seeds 1   # quicker, coarser
    .venv/bin/python benchmarks/drift_pairs.py --csv pairs.csv       # + one row per pair

The streams are tests/drift/real.py's (the ones the defaults were tuned on; its docstring and docs/drift.md say
how): for a source model A, a TF-IDF ridge predictor of A's lengths fitted out of fold, the evaluate stage's own
code on 400 held-out prompts for the references and the calibration, windows of 8 minibatches x 16 of the other
405 prompts fed to `DriftMonitor` and a detector at the params' defaults.

* No drift: A's own answers, resampled window after window (`--windows` windows per split). Every firing is a
  false alarm.
* A -> B: A's answers for `--change-at` windows, then B's answers to the same prompts. Whether the lengths "really
  drifted" is measured on the launch prompts, not assumed: the load ratio sum(B) / sum(calibrated) against the
  evaluate stage's reference (what the bias rule reads), and the Kendall tau of A's predictor against B's lengths
  against the reference tau (the tau rule). A pair is *beyond the tolerance* when either moves past the configured
  band (the load ratio outside [1/1.1, 1.1] x reference, or tau more than 0.1 below it), *within* otherwise; a
  firing on a within pair is not wrong (the widened bands reach further than the tolerance) but not asked for.

What it can show: how fast and how reliably the defaults catch real between-model changes of scale and ranking,
and how often they fire on a stationary real stream of each model (each with its own predictor quality). What it
cannot: a change *within* one RL run (the pairs are different models, mostly different in scale; no pair is a
gradual drift), n = 1 answer per prompt (a run has n = 8, so quieter windows), and only 805 prompts: the streams
resample 405 launch prompts, so windows of one split are not independent.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.drift.real (the stream builders the tests use)

from asp.drift.reference import REFERENCE_Z  # noqa: E402
from tests.drift import real  # noqa: E402


@dataclass
class Pair:
    source: str
    target: str
    load_ratio: float  # sum(target) / sum(calibrated) over the reference, on the launch prompts (split 0)
    tau: float  # Kendall tau of the source's calibrated predictions against the target's lengths
    tau_drop: float  # reference tau - tau
    beyond: bool  # past the configured tolerance (bias or tau)
    widened: bool  # past the detector's bands: the tolerance widened by REFERENCE_Z standard errors of the reference
    delays: list[int]  # per stream: windows from the change to the first firing (None: never)
    early: int  # streams that fired before the change


def true_change(source: str, target: str, split: int) -> tuple[float, float, float]:
    """(load ratio against the reference, tau against `target`'s lengths, tau drop) on the launch prompts."""
    s = real.setup(split, source)
    lengths = real.lengths()[1][target][s.launch]
    ratio = float(lengths.sum() / s.calibrated[s.launch].sum()) / s.reference_bias
    tau = float(kendalltau(s.calibrated[s.launch], lengths).statistic)
    return ratio, tau, s.reference_tau - tau


def stationary(model: str, splits: int, windows: int) -> int:
    """Firings on `windows` stationary windows of `model` per split, summed over the splits."""
    return sum(real.false_alarms(range(splits), windows, source=model))


def pair(source: str, target: str, splits: int, seeds: int, change_at: int, after: int) -> Pair:
    settings, ref = real.params(), real.setup(0, source)
    ratio, tau, drop = true_change(source, target, 0)
    log_band, tau_band = np.log(1 + float(settings["bias_tolerance"])), float(settings["tau_drop"])
    beyond = abs(np.log(ratio)) > log_band or drop > tau_band
    widened = (
        abs(np.log(ratio)) > log_band + REFERENCE_Z * ref.reference_bias_se
        or drop > tau_band + REFERENCE_Z * ref.reference_tau_se
    )
    delays: list[int] = []
    early = 0
    for split in range(splits):
        for seed in range(seeds):
            metrics = real.stream(split, change_at + after, seed, change_at, source=source, drifted=target)
            fired = real.events(metrics, real.detector(split, source))
            first = next((e.window_index for e in fired), None)
            if first is not None and first < change_at:
                early += 1
                first = next((e.window_index for e in fired if e.window_index >= change_at), None)
            delays.append(-1 if first is None else first - change_at + 1)
    return Pair(source, target, ratio, tau, drop, beyond, widened, delays, early)


def _spread(values: list[float], fmt: str = "{:g}") -> str:
    if not values:
        return "–"
    return " / ".join(fmt.format(v) for v in (min(values), float(np.median(values)), max(values)))


def summary(pairs: list[Pair], after: int) -> list[str]:
    lines = [
        f"| A -> B pairs | pairs | streams | fired within {after} windows | windows to fire, min / median / max "
        "| pairs never caught | fired before the change |",
        "|---|---|---|---|---|---|---|",
    ]

    def big(p: Pair) -> bool:
        return bool(abs(np.log(p.load_ratio)) > np.log(1.5))

    buckets = [
        ("beyond the widened bands, load ratio beyond 1/1.5–1.5", lambda p: p.widened and big(p)),
        ("beyond the widened bands, load ratio 1/1.5–1.5", lambda p: p.widened and not big(p)),
        ("beyond the tolerance, inside the widened bands (2 SE)", lambda p: p.beyond and not p.widened),
        ("within the tolerance (load ratio within 1.1, tau drop ≤ 0.1)", lambda p: not p.beyond),
    ]  # fmt: skip
    for name, keep in buckets:
        chosen = [p for p in pairs if keep(p)]
        delays = [d for p in chosen for d in p.delays]
        caught = [d for d in delays if d > 0]
        never = sum(all(d < 0 for d in p.delays) for p in chosen)
        share = f"{len(caught)} ({100 * len(caught) / max(1, len(delays)):.0f} %)"
        lines.append(
            f"| {name} | {len(chosen)} | {len(delays)} | {share} | {_spread([float(d) for d in caught])} | {never} "
            f"| {sum(p.early for p in chosen)} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splits", type=int, default=3, help="evaluate / launch splits per model")
    parser.add_argument("--windows", type=int, default=1000, help="stationary windows per split and model")
    parser.add_argument("--seeds", type=int, default=2, help="streams per split and pair")
    parser.add_argument("--change-at", type=int, default=10, help="windows of the source before the change")
    parser.add_argument("--after", type=int, default=20, help="windows of the target after the change")
    parser.add_argument("--csv", type=Path, help="also write one row per pair here")
    args = parser.parse_args()
    start, load = time.perf_counter(), os.getloadavg()[0]
    models = list(real.lengths()[1])
    refs = {m: [real.setup(s, m) for s in range(args.splits)] for m in models}
    alarms = {m: stationary(m, args.splits, args.windows) for m in models}
    pairs = [pair(a, b, args.splits, args.seeds, args.change_at, args.after) for a in models for b in models if a != b]
    per_1000 = {m: 1000 * n / (args.splits * args.windows) for m, n in alarms.items()}
    taus = [r.reference_tau for rs in refs.values() for r in rs]
    print(
        f"{len(models)} models; each model's predictor (TF-IDF ridge, out of fold) on its 400 held-out prompts: tau "
        f"{min(taus):.2f}–{max(taus):.2f} (median {np.median(taus):.2f}); {args.splits} splits\n"
    )
    print("| no drift (each model's own answers resampled) | value |\n|---|---|")
    print(
        f"| firings per 1,000 windows, per model ({args.splits} × {args.windows:,} windows each): min / median / max "
        f"| {_spread(list(per_1000.values()), '{:.1f}')} |"
    )
    noisy = sorted(((v, m) for m, v in per_1000.items() if v > 0), reverse=True)
    print(
        f"| models with any firing | {len(noisy)} of {len(models)}: "
        + ", ".join(f"{m} {v:.1f}" for v, m in noisy)
        + " |"
    )
    print(f"| firings in all {len(models) * args.splits * args.windows:,} windows | {sum(alarms.values())} |\n")
    ratios = [p.load_ratio for p in pairs]
    drops = [p.tau_drop for p in pairs]
    print(
        f"{len(pairs)} ordered pairs, {args.splits} splits × {args.seeds} seeds each, change after {args.change_at} "
        f"windows; true load ratio over the reference {min(ratios):.2f}–{max(ratios):.2f}, tau drop "
        f"{min(drops):.2f}–{max(drops):.2f} (median {np.median(drops):.2f})\n"
    )
    print("\n".join(summary(pairs, args.after)))
    slow = sorted((p for p in pairs if p.widened), key=lambda p: -np.mean([d if d > 0 else 99 for d in p.delays]))[:5]
    print("\nslowest pairs beyond the widened bands (delays per stream, -1 = never):")
    for p in slow:
        print(
            f"  {p.source} -> {p.target}: load ratio {p.load_ratio:.2f}, tau drop {p.tau_drop:.2f}, delays {p.delays}"
        )
    sft = next(p for p in pairs if (p.source, p.target) == (real.SOURCE, real.DRIFTED))
    print(f"  (the tuning pair {sft.source} -> {sft.target}: load ratio {sft.load_ratio:.2f}, delays {sft.delays})")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["source", "target", "load_ratio", "tau", "tau_drop", "beyond", "delays", "fired_early"])
            for p in pairs:
                row = [p.source, p.target, f"{p.load_ratio:.3f}", f"{p.tau:.3f}", f"{p.tau_drop:.3f}", p.beyond]
                out.writerow([*row, " ".join(map(str, p.delays)), p.early])
    print(f"\n({time.perf_counter() - start:.0f} s; load average at the start {load:.1f})")


if __name__ == "__main__":
    main()
