"""The drift detector's defaults (params.yaml `drift.*`) scored on every ordered pair of the 14 real models of
data/alpaca_eval_lengths.json, not only on phi-2-sft -> phi-2-dpo, where they were tuned (issue 36).

    .venv/bin/python benchmarks/drift_pairs.py                       # 14 models, 182 pairs (~5 min on 2 cores)
    .venv/bin/python benchmarks/drift_pairs.py --splits 1 --windows 200 --seeds 1   # quicker, coarser
    .venv/bin/python benchmarks/drift_pairs.py --csv streams.csv     # + one row per stream

The streams are tests/drift/real.py's (the ones the defaults were tuned on; its docstring and docs/drift.md say
how): for a source model A, a TF-IDF ridge predictor of A's lengths fitted out of fold, the evaluate stage's own
code on 400 held-out prompts for the references and the calibration, windows of 8 minibatches x 16 of the other
405 prompts fed to `DriftMonitor` and a detector at the params' defaults.

* No drift: A's own answers, resampled window after window (`--windows` windows per split). Every firing is a
  false alarm.
* A -> B: A's answers for `--change-at` windows, then B's answers to the same prompts. Whether the lengths "really
  drifted" is measured on each split's launch prompts, not assumed: the load ratio sum(B) / sum(calibrated) against
  the evaluate stage's reference (what the bias rule reads), and the Kendall tau of A's predictor against B's
  lengths against the reference tau (the tau rule). A stream is *beyond the tolerance* when either moves past the
  configured band (the load ratio outside [1/1.1, 1.1] x reference, or tau more than 0.1 below it), *beyond the
  widened bands* when it moves past the detector's bands (the tolerance widened by 2 standard errors of the
  reference: what the defaults are built to catch), *within* otherwise; a firing on a within stream is not wrong
  but not asked for.

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
class Stream:
    """One A -> B stream: the true change on its split's launch prompts, and what the detector did."""

    source: str
    target: str
    split: int
    seed: int
    load_ratio: float  # sum(target) / sum(calibrated), over the evaluate stage's reference
    tau_drop: float  # reference tau - Kendall tau of the source's calibrated predictions against the target
    beyond: bool  # past the configured tolerance (bias or tau)
    widened: bool  # past the detector's bands: the tolerance widened by REFERENCE_Z standard errors of the reference
    delay: int  # windows from the change to the first firing after it (1: the first changed window); -1: never
    early: bool  # fired before the change too


def true_change(source: str, target: str, split: int) -> tuple[float, float, bool, bool]:
    """(load ratio against the reference, tau drop, beyond the tolerance, beyond the widened bands) of `target`'s
    lengths against `source`'s predictor on the launch prompts of `split`."""
    s, settings = real.setup(split, source), real.params()
    lengths = real.lengths()[1][target][s.launch]
    ratio = float(lengths.sum() / s.calibrated[s.launch].sum()) / s.reference_bias
    drop = s.reference_tau - float(kendalltau(s.calibrated[s.launch], lengths).statistic)
    log_band, tau_band = np.log(1 + float(settings["bias_tolerance"])), float(settings["tau_drop"])
    beyond = bool(abs(np.log(ratio)) > log_band or drop > tau_band)
    widened = bool(
        abs(np.log(ratio)) > log_band + REFERENCE_Z * s.reference_bias_se
        or drop > tau_band + REFERENCE_Z * s.reference_tau_se
    )
    return ratio, drop, beyond, widened


def stationary(model: str, splits: int, windows: int) -> int:
    """Firings on `windows` stationary windows of `model` per split, summed over the splits."""
    return sum(real.false_alarms(range(splits), windows, source=model))


def streams(source: str, target: str, splits: int, seeds: int, change_at: int, after: int) -> list[Stream]:
    """`source`'s answers for `change_at` windows, then `target`'s for `after`, per split x seed."""
    out = []
    for split in range(splits):
        change = true_change(source, target, split)
        for seed in range(seeds):
            metrics = real.stream(split, change_at + after, seed, change_at, source=source, drifted=target)
            fired = [e.window_index for e in real.events(metrics, real.detector(split, source))]
            first = next((w for w in fired if w >= change_at), None)
            delay = -1 if first is None else first - change_at + 1
            out.append(Stream(source, target, split, seed, *change, delay, any(w < change_at for w in fired)))
    return out


def _spread(values: list[float], fmt: str = "{:g}") -> str:
    if not values:
        return "–"
    return " / ".join(fmt.format(v) for v in (min(values), float(np.median(values)), max(values)))


def _big(s: Stream) -> bool:
    return bool(abs(np.log(s.load_ratio)) > np.log(1.5))


BUCKETS = [
    ("beyond the widened bands, load ratio beyond 1/1.5–1.5", lambda s: s.widened and _big(s)),
    ("beyond the widened bands, load ratio 1/1.5–1.5", lambda s: s.widened and not _big(s)),
    ("beyond the tolerance, inside the widened bands (2 SE)", lambda s: s.beyond and not s.widened),
    ("within the tolerance (load ratio within 1.1, tau drop ≤ 0.1)", lambda s: not s.beyond),
]


def summary(found: list[Stream], after: int) -> list[str]:
    """The table: streams by how far their lengths really moved (on their split), and how the detector did."""
    lines = [
        f"| A -> B streams, by the true change on their split | pairs | streams | fired within {after} windows "
        "| windows to fire, min / median / max | fired before the change |",
        "|---|---|---|---|---|---|",
    ]
    for name, keep in BUCKETS:
        chosen = [s for s in found if keep(s)]
        caught = [float(s.delay) for s in chosen if s.delay > 0]
        share = f"{len(caught)} ({100 * len(caught) / max(1, len(chosen)):.0f} %)"
        pairs = len({(s.source, s.target) for s in chosen})
        lines.append(
            f"| {name} | {pairs} | {len(chosen)} | {share} | {_spread(caught)} | {sum(s.early for s in chosen)} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splits", type=int, default=3, help="evaluate / launch splits per model")
    parser.add_argument("--windows", type=int, default=1000, help="stationary windows per split and model")
    parser.add_argument("--seeds", type=int, default=2, help="streams per split and pair")
    parser.add_argument("--change-at", type=int, default=10, help="windows of the source before the change")
    parser.add_argument("--after", type=int, default=20, help="windows of the target after the change")
    parser.add_argument("--csv", type=Path, help="also write one row per stream here")
    args = parser.parse_args()
    start, load = time.perf_counter(), os.getloadavg()[0]
    models = list(real.lengths()[1])
    refs = {m: [real.setup(s, m) for s in range(args.splits)] for m in models}
    alarms = {m: stationary(m, args.splits, args.windows) for m in models}
    found = [
        s
        for a in models
        for b in models
        if a != b
        for s in streams(a, b, args.splits, args.seeds, args.change_at, args.after)
    ]
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
    named = ", ".join(f"{m} {v:.1f}" for v, m in noisy)
    print(f"| models with any firing | {len(noisy)} of {len(models)}: {named} |")
    print(f"| firings in all {len(models) * args.splits * args.windows:,} windows | {sum(alarms.values())} |\n")
    ratios = [s.load_ratio for s in found]
    drops = [s.tau_drop for s in found]
    print(
        f"{len(found) // (args.splits * args.seeds)} ordered pairs, {args.splits} splits × {args.seeds} seeds each, "
        f"change after {args.change_at} windows; true load ratio over the reference {min(ratios):.2f}–"
        f"{max(ratios):.2f}, tau drop {min(drops):.2f}–{max(drops):.2f} (median {np.median(drops):.2f})\n"
    )
    print("\n".join(summary(found, args.after)))
    missed = [s for s in found if s.widened and s.delay < 0]
    print(f"\nstreams beyond the widened bands never caught ({len(missed)}):")
    for s in missed:
        print(f"  {s.source} -> {s.target}, split {s.split} seed {s.seed}: load ratio {s.load_ratio:.2f}, "
              f"tau drop {s.tau_drop:.2f}")  # fmt: skip
    tuned = [s.delay for s in found if (s.source, s.target) == (real.SOURCE, real.DRIFTED)]
    print(f"the tuning pair {real.SOURCE} -> {real.DRIFTED}: windows to fire {tuned}")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow(list(Stream.__dataclass_fields__))
            for s in found:
                out.writerow([f"{v:.3f}" if isinstance(v, float) else v for v in vars(s).values()])
    print(f"\n({time.perf_counter() - start:.0f} s; load average at the start {load:.1f})")


if __name__ == "__main__":
    main()
