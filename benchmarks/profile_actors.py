"""`profile` on 1 vs N engines: measured on the demo, and predicted at the GPU preset's layout (issue 23 §1).

``measure`` runs the profile stage (`asp.pipeline.profile.run`, no tracking) on the demo's prompts and policy
(outputs/prompts, outputs/policy: `dvc repro profile` first) once per actor count, each in a fresh temporary
directory: ``profile.actors: 1`` is one engine in this process, N > 1 is N Ray engine actors on a local Ray this
script's stage run starts (runtime.ray.actor_num_cpus each). It prints wall time (Ray start and engine loads included),
the engines' summed generate seconds, minibatches per actor, generated tokens/s over the wall time, the speed-up and
whether samples.parquet is byte-identical to the 1-actor run's. Wall-clock: run it on an otherwise idle machine; the
demo's hf engine uses one thread, so the machine's cores bound the gain.

``predict`` runs the predict stage (`asp.pipeline.predict.run`) on the demo's training prompts with 1 and N predictor
actors (outputs/predictor, outputs/calibration.json: `dvc repro evaluate` first): wall time (Ray start and model
loads included), prompts/s over it, and whether the predictions equal the 1-actor run's exactly.

``simulate`` predicts the profile stage's wall time at a preset's layout (default configs/gpu-cluster.yaml over
params.yaml): prepare.profile_prompts + heldout_prompts prompts in minibatches of profile.minibatch_prompts, n_samples
responses each, capped at max_new_tokens, dispatched in order to 1 or N engines that each take the next minibatch
when idle (`asp.runtime.profile_actors.dispatch_makespan`, what the Ray path does); N defaults to 1 and the preset's
runtime layout (generation_units x actors_per_unit). A minibatch's seconds come from the simulator's
generation-time model (`asp.sim.timemodel.GenerationTimeModel`). No GPU was measured here, so by default both the
workload and the model are the ASSUMPTIONS benchmarks/bench_sim.py already makes for the GPU scale (its synthetic
DeepScaleR-like lengths, median of medians 2,500 tokens with a mass at the 8,192 cap, and its continuous-batching
coefficients); ``--model throughput`` instead assumes ``--tokens-per-s`` generated tokens per second per engine
(default 20,000, the issue's figure) and ``--step-ms`` per decode step of the longest response (default 0);
``--lengths outputs/profile/samples.parquet`` uses the demo's measured lengths rescaled from its cap to the preset's
(per prompt, seeded); ``--timings CSV`` fits the model on measured minibatch timings (metrics/profile_timings.csv of a
profile run on the target GPUs) instead of assuming it; ``--time-model PRESET`` takes a published-source GPU preset's
generation model (`asp.sim.presets`, docs/simulator.md) and prints each wall time and speed-up with its min-max over
the preset's sensitivity grid (decode costs x0.5-2, 13 points).

    .venv/bin/python benchmarks/profile_actors.py measure                      # 1 vs 2 actors, all demo prompts
    .venv/bin/python benchmarks/profile_actors.py measure --actors 1 2 --prompts 200
    .venv/bin/python benchmarks/profile_actors.py predict                      # predict: 1 vs 2 actors
    .venv/bin/python benchmarks/profile_actors.py simulate                     # GPU preset: 1 vs 12 engines
    .venv/bin/python benchmarks/profile_actors.py simulate --engines 1 4 12 16
    .venv/bin/python benchmarks/profile_actors.py simulate --model throughput --step-ms 15
    .venv/bin/python benchmarks/profile_actors.py simulate --time-model h100-qwen3-8b   # sourced, with ranges
    .venv/bin/python benchmarks/profile_actors.py simulate --timings metrics/profile_timings.csv --form continuous
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from asp.config import Params, deep_merge, load_params, read_yaml, validate_params
from asp.env import set_offline_defaults
from asp.errors import exit_user_error
from asp.runtime.profile_actors import dispatch_makespan, pool_size
from asp.sim.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]


def _subset_prompts(src: Path, dst: Path, limit: int | None) -> int:
    """Copy profile.parquet / heldout.parquet to `dst`, the first `limit` prompts in all (profile ones first)."""
    dst.mkdir(parents=True)
    left, total = limit, 0
    for role in ("profile", "heldout"):
        frame = pd.read_parquet(src / f"{role}.parquet")
        if left is not None:
            frame, left = frame.head(max(left, 0)), max(left - len(frame), 0)
        frame.to_parquet(dst / f"{role}.parquet", index=False)
        total += len(frame)
    return total


def measure_one(params: Params, actors: int, prompts: Path, root: Path) -> dict[str, Any]:
    """One profile run with `actors` engines under `root`; its wall time and what its files say."""
    from asp.pipeline import profile
    from asp.steps.paths import rebase
    from asp.tracking import NullTracker

    paths = replace(rebase(profile.Paths(), root), policy=ROOT / "outputs/policy", prompts=prompts)
    run_params = params.model_copy(update={"profile": params.profile.model_copy(update={"actors": actors})})
    start = time.perf_counter()
    profile.run(run_params, paths, NullTracker())
    wall = time.perf_counter() - start
    timings = pd.read_csv(paths.timings)
    return {
        "actors": actors,
        "wall_s": wall,
        "engine_s": float(timings["wall_s"].sum()),
        "per_actor": timings.groupby("actor").size().to_dict(),
        "tokens": int(timings["total_tokens"].sum()),
        "minibatches": len(timings),
        "samples": (paths.out_dir / "samples.parquet").read_bytes(),
    }


def measure(args: argparse.Namespace) -> None:
    params = load_params(ROOT / "params.yaml")
    source = ROOT / "outputs/prompts"
    if not (source / "profile.parquet").is_file() or not (ROOT / "outputs/policy").is_dir():
        exit_user_error(
            "needs outputs/prompts and outputs/policy: run `dvc repro policy prepare` (or `make run`) first"
        )
    with tempfile.TemporaryDirectory(prefix="asp-profile-actors-") as tmp:
        n = _subset_prompts(source, Path(tmp) / "prompts", args.prompts)
        rows = []
        for actors in args.actors:
            rows.append(measure_one(params, actors, Path(tmp) / "prompts", Path(tmp) / f"run{actors}"))
            print(f"[bench] {actors} actor(s): {rows[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    base = rows[0]
    prof = params.profile
    print(
        f"\nprofile on the demo: {n} prompts x {prof.n_samples} samples, cap {prof.max_new_tokens}, "
        f"{base['minibatches']} minibatches of {prof.minibatch_prompts} "
        f"(hf engine, {prof.engine.num_threads} thread each; "
        f"runtime.ray.actor_num_cpus {params.runtime.ray.actor_num_cpus:g})\n"
    )
    print("| actors | wall (s) | Σ engine generate (s) | minibatches per actor | tokens/s (wall) | speed-up | "
          "samples = 1 actor's |")  # fmt: skip
    print("|---:|---:|---:|---|---:|---:|---|")
    for r in rows:
        same = "yes (bytes)" if r["samples"] == base["samples"] else "NO"
        print(
            f"| {r['actors']} | {r['wall_s']:.1f} | {r['engine_s']:.1f} | "
            f"{', '.join(f'{a}: {k}' for a, k in sorted(r['per_actor'].items()))} | {r['tokens'] / r['wall_s']:.0f} | "
            f"{base['wall_s'] / r['wall_s']:.2f}x | {same} |"
        )


def predict_bench(args: argparse.Namespace) -> None:
    from asp.pipeline import predict
    from asp.tracking import NullTracker

    params = load_params(ROOT / "params.yaml")
    rows = []
    with tempfile.TemporaryDirectory(prefix="asp-predict-actors-") as tmp:
        for actors in args.actors:
            paths = predict.Paths(
                prompts=ROOT / "outputs/prompts/train.parquet",
                predictor=ROOT / "outputs/predictor",
                calibration=ROOT / "outputs/calibration.json",
                out=Path(tmp) / f"predictions{actors}.parquet",
                metrics=Path(tmp) / f"predict{actors}.json",
            )
            run_params = params.model_copy(update={"predict": params.predict.model_copy(update={"actors": actors})})
            start = time.perf_counter()
            predict.run(run_params, paths, NullTracker())
            wall = time.perf_counter() - start
            rows.append((actors, wall, pd.read_parquet(paths.out)))
            print(f"[bench] predict, {actors} actor(s): {wall:.1f} s", file=sys.stderr, flush=True)
    base = rows[0]
    n = len(base[2])
    print(f"\npredict on the demo: {n} prompts, batch {params.predict.batch_size}, {params.predictor.backbone}\n")
    print("| actors | wall (s) | prompts/s (wall) | speed-up | predictions = 1 actor's |")
    print("|---:|---:|---:|---:|---|")
    for actors, wall, out in rows:
        same = "yes (exactly)" if out.equals(base[2]) else "NO"
        print(f"| {actors} | {wall:.1f} | {n / wall:.0f} | {base[1] / wall:.2f}x | {same} |")


def sample_lengths(samples: pd.DataFrame, cap_from: int, cap_to: int, prompts: int, n: int, seed: int) -> np.ndarray:
    """[prompts, n] response lengths: `prompts` prompts drawn (with replacement) from the measured profile, each
    with its own samples, rescaled from `cap_from` to `cap_to` (relative length kept, capped)."""
    per_prompt = [g.to_numpy() for _, g in samples.groupby("prompt_id", sort=True)["length"] if len(g) >= n]
    picks = np.random.default_rng(seed).integers(0, len(per_prompt), prompts)
    lengths = np.stack([per_prompt[i][:n] for i in picks]).astype(np.float64)
    return np.minimum(np.ceil(lengths * cap_to / cap_from), cap_to)


def time_model(args: argparse.Namespace) -> tuple[Any, str, float | None]:
    """The generation-time model, how it was obtained, and the mean prompt tokens to feed it (None: the workload's)."""
    from asp.sim.timemodel import FEATURES, GenerationTimeModel, fit_generation_model

    if args.time_model:
        from asp.sim.presets import get_preset

        preset = get_preset(args.time_model)
        return preset.gen, f"the published-source preset {preset.name} (docs/simulator.md)", None
    if args.model == "bench_sim" and not args.timings:
        from bench_sim import GEN_COEF, assumed_generation_model

        return (
            assumed_generation_model(),
            f"benchmarks/bench_sim.py's ASSUMED continuous (vLLM-like) model {GEN_COEF}",
            None,
        )
    if args.timings:
        frame = pd.read_csv(args.timings)
        model, report = fit_generation_model(frame, args.form, folds=5, seed=0)
        prompt_tokens = float(frame["prompt_tokens"].sum() / max(frame["num_prompts"].sum(), 1))
        how = (
            f"{args.form} model fitted on {args.timings} ({len(frame)} minibatches, held-out R² "
            f"{report['r2_heldout']:.3f})"
        )
        return model, how, prompt_tokens
    coef = (0.0, args.step_ms / 1000.0, 1.0 / args.tokens_per_s, 0.0, 0.0)
    model = GenerationTimeModel("continuous", coef, FEATURES["continuous"])
    how = (
        f"continuous (vLLM) model with ASSUMED coefficients: {args.tokens_per_s:,.0f} generated tokens/s per engine, "
        f"{args.step_ms:g} ms per decode step of the longest response, no prefill cost"
    )
    return model, how, args.prompt_tokens


def workload(args: argparse.Namespace, prompts: int, n: int, cap: int) -> tuple[np.ndarray, np.ndarray, str]:
    """([prompts, n] response lengths, [prompts] prompt tokens, what they are)."""
    if args.lengths == "synthetic":
        from bench_sim import CAP, N_SAMPLES, synthetic_workload

        if (cap, n) != (CAP, N_SAMPLES):
            exit_user_error(f"--lengths synthetic is bench_sim's cap {CAP} x {N_SAMPLES} samples, not {cap} x {n}")
        _, work = synthetic_workload(prompts, args.seed)
        what = "benchmarks/bench_sim.py's SYNTHETIC DeepScaleR-like lengths (log-normal, median of medians 2,500)"
        return work.lengths.astype(np.float64), work.prompt_tokens.astype(np.float64), what
    demo = pd.read_parquet(ROOT / args.lengths, columns=["prompt_id", "length"])
    demo_cap = load_params(ROOT / "params.yaml").profile.max_new_tokens
    lengths = sample_lengths(demo, demo_cap, cap, prompts, n, args.seed)
    return lengths, np.full(prompts, args.prompt_tokens), f"{args.lengths} rescaled from cap {demo_cap} to {cap}"


def simulate(args: argparse.Namespace) -> None:
    from asp.runtime import RuntimeConfig

    raw = deep_merge(read_yaml(ROOT / "params.yaml"), read_yaml(ROOT / args.preset))
    params = validate_params(raw, f"params.yaml + {args.preset}")
    prof, prep = params.profile, params.prepare
    prompts, mb, n = prep.profile_prompts + prep.heldout_prompts, prof.minibatch_prompts, prof.n_samples
    cap = prof.max_new_tokens
    engines = args.engines or [1, pool_size(RuntimeConfig.from_params(params), "runtime")]
    lengths, prompt_tokens, what = workload(args, prompts, n, cap)
    model, how, fitted_prompt_tokens = time_model(args)
    if fitted_prompt_tokens is not None:
        prompt_tokens = np.full(prompts, fitted_prompt_tokens)
    starts = list(range(0, prompts, mb))
    seconds = minibatch_seconds(model, lengths, prompt_tokens, mb, n)
    grid = []  # under a preset: the same minibatches at every point of its sensitivity grid
    if args.time_model:
        from asp.sim.presets import SENSITIVITY_GRID, get_preset, scaled_models

        train = get_preset(args.time_model).train
        grid = [
            minibatch_seconds(scaled_models(model, train, sc)[0], lengths, prompt_tokens, mb, n)
            for sc in SENSITIVITY_GRID
        ]
    print(
        f"\nprofile at {args.preset}'s layout: {prompts} prompts x {n} samples, cap {cap}, {len(starts)} minibatches "
        f"of {mb} prompts; lengths: {what} (mean {lengths.mean():.0f} tokens, {np.mean(lengths >= cap):.1%} at the "
        f"cap); time: {how}\n"
    )
    ranged = " [min-max over the preset's sensitivity grid]" if grid else ""
    print(
        f"| engines | predicted wall{ranged} | speed-up{ranged} | engine busy (mean of engines) | "
        "minibatch s (min / median / max) |"
    )
    print("|---:|---:|---:|---:|---|")
    one = float(seconds.sum())
    for e in engines:
        wall, busy = dispatch_makespan(seconds, e)
        wall_cell, speed_cell = f"{wall:,.0f} s ({wall / 3600:.2f} h)", f"{one / wall:.2f}x"
        if grid:
            walls = [dispatch_makespan(g, e)[0] for g in grid]
            speeds = [float(g.sum()) / w for g, w in zip(grid, walls, strict=True)]
            wall_cell += f" [{min(walls):,.0f}-{max(walls):,.0f} s]"
            speed_cell += f" [{min(speeds):.2f}-{max(speeds):.2f}x]"
        print(
            f"| {e} | {wall_cell} | {speed_cell} | {np.mean(busy) / wall:.0%} | "
            f"{seconds.min():.0f} / {np.median(seconds):.0f} / {seconds.max():.0f} |"
        )


def minibatch_seconds(model: Any, lengths: np.ndarray, prompt_tokens: np.ndarray, mb: int, n: int) -> np.ndarray:
    """Seconds of each minibatch of `mb` prompts (in order) under the generation-time `model`."""
    return np.array(
        [
            model.seconds(len(b), n, int(b.max()), int(b.sum()), int(round(prompt_tokens[s : s + mb].sum())))
            for s, b in ((s, lengths[s : s + mb]) for s in range(0, len(lengths), mb))
        ]
    )


def main(argv: list[str] | None = None) -> None:
    set_offline_defaults()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="1 vs N actors on the demo (wall clock)")
    m.add_argument("--actors", type=int, nargs="+", default=[1, 2], help="actor counts; the first is the baseline")
    m.add_argument("--prompts", type=int, default=None, help="profile only the first N prompts (default: all)")
    pr = sub.add_parser("predict", help="the predict stage with 1 vs N predictor actors on the demo (wall clock)")
    pr.add_argument("--actors", type=int, nargs="+", default=[1, 2], help="actor counts; the first is the baseline")
    s = sub.add_parser("simulate", help="predicted profile wall time at a preset's layout")
    s.add_argument("--preset", default="configs/gpu-cluster.yaml")
    s.add_argument("--engines", type=int, nargs="+", default=None, help="default: 1 and the preset's runtime layout")
    s.add_argument("--model", choices=["bench_sim", "throughput"], default="bench_sim",
                   help="bench_sim: benchmarks/bench_sim.py's assumed vLLM-like model; throughput: --tokens-per-s "
                   "and --step-ms")  # fmt: skip
    s.add_argument(
        "--time-model",
        choices=list(PRESETS),
        default=None,
        help="a published-source GPU preset (asp.sim.presets) instead of --model, with its sensitivity range",
    )
    s.add_argument("--tokens-per-s", type=float, default=20_000.0, help="assumed generated tokens/s per engine")
    s.add_argument("--step-ms", type=float, default=0.0, help="assumed ms per decode step of the longest response")
    s.add_argument("--prompt-tokens", type=float, default=0.0, help="mean prompt tokens (assumed model: unused)")
    s.add_argument("--timings", default=None, help="fit the model on these measured minibatch timings instead")
    s.add_argument("--form", choices=["static", "continuous"], default="continuous")
    s.add_argument(
        "--lengths", default="synthetic", help="synthetic (bench_sim's workload) or a samples.parquet to rescale"
    )
    s.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    {"measure": measure, "predict": predict_bench, "simulate": simulate}[args.command](args)


if __name__ == "__main__":
    main()
