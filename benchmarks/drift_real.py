"""The drift detector on real length streams and on synthetic ones, at the shipped defaults and at the old ones
(issue 21 §4), and (``--demo-launch``) the demo's own launch with the watch on.

    .venv/bin/python benchmarks/drift_real.py                 # the table (~3 min on an idle 2-core machine)
    .venv/bin/python benchmarks/drift_real.py --splits 3      # fewer evaluate / launch splits, quicker
    .venv/bin/python benchmarks/drift_real.py --demo-launch   # + the demo launch (needs `dvc repro schedule`; ~5 min)

Real streams (tests/drift/real.py): AlpacaEval's real answer lengths (data/alpaca_eval_lengths.json, one answer per
prompt and model), a TF-IDF ridge predictor of phi-2-sft's lengths fitted out of fold, the evaluate stage's own code
(`asp.pipeline.evaluate.score`) on 400 held-out prompts for the references, windows of 8 minibatches x 16 prompts
drawn from the other 405 prompts and fed to `DriftMonitor` as `DriftWatch` feeds it; a split = one seeded
held-out / launch partition. Stationary: phi-2-sft's own answers. Drift: from window 10 on, phi-2-dpo's answers to
the same prompts. Synthetic streams (tests/drift/synthetic.py): n = 8 right-skewed samples per prompt, the
calibrated prediction the conditional mean. "Old": the defaults before issue 21 (bias = median ratio against 1.0,
tau_drop 0.08, bias_tolerance 0.12, references taken as exact); "new": the params' defaults (bias = load ratio
against the evaluate stage's reference, bands widened by 2 standard errors of the references).

`--demo-launch` runs, in a temporary directory, the evaluate stage (for the references of the predictor in
outputs/predictor) and then the shipped launch (params.yaml: the watch on, action recalibrate), and prints its
drift summary: the demo's stationary stream should not fire.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.drift.* (the stream builders the tests use)

from tests.drift import real, synthetic  # noqa: E402

NOISE: dict[str, list[float]] = {"drift/bias_window": [], "drift/median_ratio": []}  # per-split window log-sd


def real_false_alarms(splits: int, windows: int) -> tuple[list[int], list[int]]:
    """(new, old) firings per split on `windows` stationary windows (and each bias statistic's window log-sd)."""
    new, old = [], []
    for split in range(splits):
        metrics = list(real.stream(split, windows, seed=split))
        new.append(len(real.events(iter(metrics), real.detector(split))))
        old.append(len(real.events(real.old_metrics(iter(metrics)), real.old_detector(split))))
        for key, found in NOISE.items():
            found.append(float(np.std(np.log([m[key] for m in metrics]))))
    return new, old


def real_delays(splits: int, seeds: int, change_at: int = 10, windows: int = 20) -> tuple[list[int], list[int]]:
    """(new, old) windows from the switch to phi-2-dpo until the first firing (0: fired before the switch; never:
    windows - change_at + 1), per split x seed."""
    new, old = [], []
    for split in range(splits):
        for seed in range(seeds):
            metrics = list(real.stream(split, windows, seed, change_at))
            for out, fired in (
                (new, real.events(iter(metrics), real.detector(split))),
                (old, real.events(real.old_metrics(iter(metrics)), real.old_detector(split))),
            ):
                out.append(max(0, fired[0].window_index - change_at + 1) if fired else windows - change_at + 1)
    return new, old


def synthetic_old_detector() -> object:
    from asp.drift import DriftDetector

    return DriftDetector(synthetic.REFERENCE_TAU, **real.OLD)  # type: ignore[arg-type]


def synthetic_rows(seeds: int, windows: int) -> dict[str, tuple[str, str]]:
    """Synthetic rows: stationary firings per 1,000 windows, windows to fire after a 20 % shift and a tau drop."""
    new_fa, old_fa = [], []
    for seed in range(seeds):
        metrics = list(synthetic.stream(seed, windows))
        new_fa.append(len(synthetic.fired_windows(iter(metrics))))
        old = synthetic_old_detector()
        old_fa.append(sum(old.update(m) is not None for m in real.old_metrics(iter(metrics))))  # type: ignore[attr-defined]
    rows = {
        f"synthetic stationary: firings per 1,000 windows ({seeds} x {windows})": (
            _per_1000(new_fa, windows),
            _per_1000(old_fa, windows),
        )
    }
    for name, after in (
        ("synthetic 20 % length shift", {"scale": 1.2}),
        ("synthetic tau drop 0.15", {"pred_sigma": synthetic.PRED_SIGMA_DROPPED}),
    ):
        new_d, old_d = [], []
        for seed in range(20):
            metrics = list(synthetic.stream(seed, 40, 20, **after))
            fired = synthetic.fired_windows(iter(metrics))
            new_d.append(max(0, fired[0] - 19) if fired else 21)
            old = synthetic_old_detector()
            hits = [i for i, m in enumerate(real.old_metrics(iter(metrics))) if old.update(m) is not None]  # type: ignore[attr-defined]
            old_d.append(max(0, hits[0] - 19) if hits else 21)
        rows[f"{name}: windows to fire (20 seeds; 0 = before it)"] = (_spread(new_d), _spread(old_d))
    return rows


def _per_1000(fired: list[int], windows: int) -> str:
    return f"{1000 * sum(fired) / (windows * len(fired)):.1f} ({sum(fired)} in {windows * len(fired):,})"


def _spread(values: list[int]) -> str:
    return f"median {np.median(values):g}, max {max(values)}" + (" (fired early)" if min(values) == 0 else "")


def table(splits: int, windows: int) -> str:
    new_fa, old_fa = real_false_alarms(splits, windows)
    new_d, old_d = real_delays(splits, 2)
    refs = [real.setup(s) for s in range(splits)]
    rows = {
        f"real stationary (phi-2-sft): firings per 1,000 windows ({splits} splits x {windows})": (
            _per_1000(new_fa, windows),
            _per_1000(old_fa, windows),
        ),
        "... per split": (" ".join(map(str, new_fa)), " ".join(map(str, old_fa))),
        f"real phi-2-sft -> phi-2-dpo: windows to fire ({splits} splits x 2 seeds; 0 = before the switch)": (
            _spread(new_d),
            _spread(old_d),
        ),
        **synthetic_rows(3, windows),
    }
    lines = [
        f"evaluate stage on {real.EVAL_PROMPTS} held-out prompts, splits 0-{splits - 1}: tau "
        f"{min(r.reference_tau for r in refs):.3f}-{max(r.reference_tau for r in refs):.3f}, load ratio "
        f"{min(r.reference_bias for r in refs):.3f}-{max(r.reference_bias for r in refs):.3f}, median ratio "
        f"{min(r.median_ratio for r in refs):.3f}-{max(r.median_ratio for r in refs):.3f}; standard errors: tau "
        f"{np.mean([r.reference_tau_se for r in refs]):.3f}, "
        f"log load ratio {np.mean([r.reference_bias_se for r in refs]):.3f}; window-to-window log-sd of the load "
        f"ratio {np.mean(NOISE['drift/bias_window']):.3f}, "
        f"of the median ratio {np.mean(NOISE['drift/median_ratio']):.3f}",
        "",
        "| stream | new defaults | old defaults |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {new} | {old} |" for name, (new, old) in rows.items()]
    return "\n".join(lines)


def demo_launch() -> dict[str, float]:
    """The evaluate stage then the shipped launch in a temporary directory; the launch's drift summary."""
    from asp.config import load_params
    from asp.env import set_offline_defaults
    from asp.pipeline import evaluate, launch
    from asp.tracking import NullTracker

    set_offline_defaults()
    os.chdir(ROOT)
    params = load_params(ROOT / "params.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        ev = replace(evaluate.Paths(), calibration=t / "cal.json", metrics=t / "predictor.json", plot=t / "s.png")
        evaluate.run(params, ev, NullTracker())
        paths = replace(
            launch.Paths(),
            predictor_metrics=ev.metrics,
            out_dir=t / "launch",
            state_dir=t / "state",
            metrics=t / "launch.json",
            plot=t / "timeline.png",
            curve_plot=t / "curve.png",
            drift_plot=t / "drift.png",
        )
        metrics = launch.run(params, paths, NullTracker())
    return {k: v for k, v in metrics.items() if k.startswith("drift/summary/") or k == "runtime/summary/wall_s"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splits", type=int, default=10, help="evaluate / launch splits of the 805 prompts")
    parser.add_argument("--windows", type=int, default=1000, help="stationary windows per split")
    parser.add_argument("--demo-launch", action="store_true", help="also run the demo launch with the watch on")
    args = parser.parse_args()
    start, load = time.perf_counter(), os.getloadavg()[0]
    print(table(args.splits, args.windows))
    print(f"\n({time.perf_counter() - start:.0f} s; load average at the start {load:.1f})")
    if args.demo_launch:
        for key, value in demo_launch().items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
