"""asp against TRL's GRPOTrainer on the demo, and asp's schedule inside TRL, side by side on this machine.

Four arms per seed, interleaved (seed 0: every arm, then seed 1, ...), on the same policy (the `policy` stage's
checkpoint), training prompts (the `prepare` stage's), reward (the demo task's), n samples, prompts per update,
max new tokens, temperature, lr (constant after the same warm-up), clipping (0.2), KL (0), Adam settings, gradient
clipping and number of updates (each update = one global batch of ``runtime.global_batch_prompts`` prompts):

* ``TRL``: ``trl.GRPOTrainer`` as a TRL user runs it on a CPU (``use_cpu``, fp32, its default shuffled order, one
  ``generate`` call per generation batch, loss ``dapo`` = token-level, group-std advantages);
* ``TRL + asp``: the same trainer walking asp's schedule (`asp.integrations.trl.ScheduledGRPOTrainer`; the schedule
  stage's loads re-cut with kappa 0 so one minibatch = one generation batch; the prompt count cut to a multiple of b);
* ``asp sync C0``: asp's `launch` stage, synchronous, original order (2 hf actors + the GRPO Training Unit on Ray);
* ``asp C4``: asp's `launch`, asynchronous on the length-aware schedule (the default).

Held-out reward: the SAME code for every arm (`asp.trainers.heldout.heldout_rewards`: new demo problems, 4 samples
each, the same sampling seed) on the weights saved at ``--evals`` evenly spaced updates; the wall-clock of a
checkpoint counts from the arm's start (start-up included: Ray and actors for asp, model load for TRL). "Time to
TRL's reward" is the first checkpoint whose held-out reward reaches the final reward TRL reached in that seed.
Peak memory: the largest summed RSS of this process and all its descendants (Ray workers included), sampled every
0.2 s. TRL runs with torch on 2 threads (the cores asp's two actors and trainer share).

Needs the pipeline outputs up to `schedule` (``asp repro schedule`` after its upstream stages) and the peers extra
(``make install`` installs it; elsewhere ``pip install -e '.[peers]'``). Writes benchmarks/results/vs_trl.json
(``--out``); nothing under outputs/.

    .venv/bin/python benchmarks/vs_trl.py --quick             # 1 seed, 6 updates, 2 checkpoints, 32 held-out problems
    .venv/bin/python benchmarks/vs_trl.py                     # 3 seeds, 30 updates (docs/benchmarks.md)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("TRL", "TRL + asp", "asp sync C0", "asp C4")
TRL_THREADS = 2


class PeakRSS:
    """Largest summed RSS (bytes) of this process and its descendants, sampled in a thread."""

    def __init__(self, every_s: float = 0.2) -> None:
        import psutil

        self.proc, self.every_s, self.peak, self._stop = psutil.Process(), every_s, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for p in [self.proc, *self.proc.children(recursive=True)]:
                with contextlib.suppress(Exception):  # a process that ended between listing and reading
                    total += p.memory_info().rss
            self.peak = max(self.peak, total)
            self._stop.wait(self.every_s)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def checkpoint_steps(iterations: int, evals: int) -> list[int]:
    """`evals` update counts evenly spaced up to `iterations` (the last = `iterations`)."""
    return sorted({max(1, round(iterations * (i + 1) / evals)) for i in range(evals)})


# --- TRL arms -------------------------------------------------------------------------------------------------------


def trl_config(params: Any, out: Path, seed: int, iterations: int) -> Any:
    from trl import GRPOConfig

    rt, g = params.runtime, params.runtime.grpo
    return GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=seed,
        max_steps=iterations,
        per_device_train_batch_size=rt.global_batch_prompts * rt.sampling.n_samples,
        num_generations=rt.sampling.n_samples,
        max_completion_length=rt.sampling.max_new_tokens,
        temperature=rt.sampling.temperature,
        top_p=rt.sampling.top_p,
        learning_rate=g.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=g.warmup_steps,
        weight_decay=g.weight_decay,
        adam_beta1=g.betas[0],
        adam_beta2=g.betas[1],
        adam_epsilon=g.adam_eps,
        max_grad_norm=g.max_grad_norm,
        epsilon=g.clip_low,
        epsilon_high=g.clip_high,
        beta=g.kl_coef,
        loss_type="dapo" if g.loss_aggregation == "token" else "grpo",
        scale_rewards="group" if g.advantage_scale == "std" else "none",
    )


def run_trl(params: Any, paths: Any, seed: int, iterations: int, steps: list[int], scheduled: bool, tmp: Path) -> dict:
    """One TRL run; weights saved at `steps`. Returns its timings, lengths and checkpoints."""
    import pandas as pd
    import torch
    from datasets import Dataset
    from safetensors.torch import save_model
    from transformers import TrainerCallback
    from trl import GRPOTrainer  # imported before the clock starts (the first arm would pay it alone)

    from asp.demo.task import reward
    from asp.integrations.trl import ScheduledGRPOTrainer
    from asp.rollout import load_tokenizer
    from asp.steps.loaders import policy_model_path

    start = time.perf_counter()
    torch.set_num_threads(TRL_THREADS)
    prompts = pd.read_parquet(paths.prompts)
    plan = asp_plan(params, paths, seed) if scheduled else None
    if plan is not None:
        keep = set(plan.prompt_ids.tolist())
        prompts = prompts[prompts["prompt_id"].isin(keep)]
    dataset = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": p}] for p in prompts["problem"]],
        "answer": list(prompts["answer"]),
        "prompt_id": list(prompts["prompt_id"]),
    })  # fmt: skip
    batches: list[list[int]] = []

    def demo_reward(completions, answer, completion_ids, **_):
        batches.append([len(c) for c in completion_ids])
        return [reward(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]

    gen_s: list[float] = []
    checkpoints: list[dict] = []

    class Save(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step in steps:
                wall = time.perf_counter() - start
                path = tmp / f"trl-step-{state.global_step}.safetensors"
                save_model(model, str(path))
                checkpoints.append({"step": state.global_step, "wall_s": wall, "weights": str(path)})
            return control

    model_dir = policy_model_path(paths.policy)
    kwargs = dict(
        model=str(model_dir), processing_class=load_tokenizer(model_dir), reward_funcs=demo_reward,
        train_dataset=dataset, callbacks=[Save()],
    )  # fmt: skip
    args = trl_config(params, tmp / "trl", seed, iterations)
    if plan is not None:
        args.shuffle_dataset = False
        trainer = ScheduledGRPOTrainer(args=args, asp_plan=plan, **kwargs)
    else:
        trainer = GRPOTrainer(args=args, **kwargs)
    generate = trainer._generate_single_turn

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            gen_s.append(time.perf_counter() - t0)

    trainer._generate_single_turn = timed
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    lengths = [np.asarray(b) for b in batches]
    tokens = float(sum(b.sum() for b in lengths))
    slots = float(sum(b.size * b.max() for b in lengths))
    return {
        "time_per_update_s": train_s / iterations,
        "generation_s": float(sum(gen_s)),
        "training_s": train_s - float(sum(gen_s)),
        "generation_share": float(sum(gen_s)) / train_s,
        "tokens_per_s": tokens / train_s,
        "slots_after_eos": 1.0 - tokens / slots,
        "run_wall_s": time.perf_counter() - start,
        "checkpoints": checkpoints,
    }


def asp_plan(params: Any, paths: Any, seed: int) -> Any:
    """The schedule stage's loads re-cut with kappa 0 (TRL needs one minibatch size), prompts cut to a multiple
    of b."""
    import pandas as pd

    from asp.integrations.trl import SchedulePlan
    from asp.schedule import ScheduleSpec, build_schedule
    from asp.schedule.history import HistoryEstimator

    s, h = params.schedule, params.runtime.history
    frame = pd.read_parquet(paths.schedule).sort_values("prompt_id")
    b = params.runtime.global_batch_prompts
    frame = frame.iloc[: len(frame) // b * b]
    spec = ScheduleSpec(b=b, kappa=0, k=s.k, iterations=s.iterations, method=s.method)
    schedule = build_schedule(
        frame["prompt_id"].to_numpy(), frame["load_used"].to_numpy(), **spec.kwargs(), seed=seed, loads="raw",
        shuffle=s.shuffle_groups,
    )  # fmt: skip
    estimator = HistoryEstimator(h.prior_samples, h.drift_per_version)
    return SchedulePlan.from_schedule(schedule, spec, estimator=estimator, seed=seed, shuffle=s.shuffle_groups)


# --- asp arms -------------------------------------------------------------------------------------------------------


def run_asp(params: Any, paths: Any, seed: int, iterations: int, steps: list[int], mode: str, tmp: Path) -> dict:
    """One real `launch` (GRPO, 2 hf actors), trainer checkpoints at every `steps` interval, kept."""
    from asp.pipeline import launch
    from asp.tracking import NullTracker

    interval = steps[0] if all(s % steps[0] == 0 for s in steps) else 1
    rt = params.runtime
    update = {
        "mode": mode, "condition": "C0" if mode == "sync" else "C4", "iterations": iterations,
        "heldout_problems": 0, "checkpoint_interval": interval,
        "trainer": rt.trainer.model_copy(update={"kind": "grpo"}),
        "grpo": rt.grpo.model_copy(update={"keep_checkpoints": 10_000}),
    }  # fmt: skip
    p = params.model_copy(
        update={"runtime": rt.model_copy(update=update), "common": params.common.model_copy(update={"seed": seed})}
    )
    state = tmp / f"state-{mode}"
    run_paths = replace(
        paths, out_dir=tmp / f"out-{mode}", state_dir=state, metrics=tmp / "m.json", plot=tmp / "p.png"
    )
    start, epoch = time.perf_counter(), time.time()
    metrics = launch.run(p, run_paths, NullTracker())
    total = time.perf_counter() - start
    checkpoints = []
    for step in steps:
        weights = next(state.glob(f"**/trainer/step-{step:08d}/model.safetensors"), None)
        if weights is not None:  # wall-clock: when the checkpoint's weights were written, from the arm's start
            checkpoints.append({"step": step, "wall_s": weights.stat().st_mtime - epoch, "weights": str(weights)})
    return {
        "time_per_update_s": metrics.get("runtime/summary/mean_iteration_time_s", float("nan")),
        "generation_s": metrics.get("grpo/T_gen_s", float("nan")),  # per minibatch (actors overlap)
        "training_s": metrics.get("grpo/T_train_s", float("nan")),  # per trainer step
        "tokens_per_s": metrics.get("runtime/summary/tokens_per_s", float("nan")),
        "run_wall_s": total,
        "checkpoints": checkpoints,
    }


# --- held-out reward and the table ----------------------------------------------------------------------------------


def evaluate(policy: Path, records: list[dict], result: dict, params: Any, seed: int) -> None:
    """Held-out reward of every checkpoint of `result` (in place), by the one shared evaluation."""
    from asp.trainers.heldout import heldout_rewards

    for c in result["checkpoints"]:
        r = heldout_rewards(
            policy, c["weights"], records, max_new_tokens=params.runtime.sampling.max_new_tokens, seed=seed,
            temperature=params.runtime.sampling.temperature, device="cpu", num_threads=TRL_THREADS,
        )  # fmt: skip
        c["heldout_reward"] = r.mean
        c.pop("weights")


def time_to(checkpoints: list[dict], target: float) -> float:
    """Wall-clock of the first checkpoint whose held-out reward reaches `target` (nan: none did)."""
    return next((c["wall_s"] for c in checkpoints if c["heldout_reward"] >= target - 1e-12), float("nan"))


ROWS = (
    ("time_per_update_s", "time per update (s)", ".2f"),
    ("generation_s", "generation (s; TRL: total, asp: per minibatch)", ".1f"),
    ("training_s", "training (s; TRL: total, asp: per step)", ".2f"),
    ("generation_share", "generation share of train time", ".2f"),
    ("slots_after_eos", "decode slots after EOS (TRL)", ".2f"),
    ("tokens_per_s", "generated tokens/s", ",.0f"),
    ("peak_rss_gib", "peak memory, process tree (GiB)", ".2f"),
    ("run_wall_s", "wall-clock incl. start-up (s)", ".0f"),
    ("final_heldout_reward", "held-out reward after the updates", ".3f"),
    ("time_to_trl_reward_s", "wall-clock to TRL's final held-out reward (s)", ".0f"),
    ("load_start", "1-min load average at start (other jobs)", ".1f"),
)


def summarize(results: dict[str, list[dict]]) -> str:
    """Markdown table: mean ± half-width of a 95 % t interval over seeds (± omitted for one seed)."""
    from scipy import stats

    lines = ["| metric | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for key, label, fmt in ROWS:
        cells = []
        for arm in results:
            x = np.array([r.get(key, np.nan) for r in results[arm]], dtype=float)
            x = x[np.isfinite(x)]
            if x.size == 0:
                cells.append("–" if key != "time_to_trl_reward_s" else "not reached")
                continue
            half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size) if x.size > 1 else None
            cells.append(format(x.mean(), fmt) + (f" ± {format(half, fmt)}" if half is not None else "")
                         + (f" ({x.size}/{len(results[arm])})" if key == "time_to_trl_reward_s" else ""))  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=30, help="GRPO updates per arm")
    parser.add_argument("--evals", type=int, default=3, help="held-out checkpoints per arm (evenly spaced)")
    parser.add_argument("--heldout", type=int, default=64, help="held-out problems (x 4 samples)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--quick", action="store_true", help="1 seed, 6 updates, 2 checkpoints, 32 problems")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/vs_trl.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.iterations, args.evals, args.heldout = args.seeds[:1], 6, 2, 32
    from asp.cli.plan import load_params_with
    from asp.env import set_offline_defaults
    from asp.io.files import write_json
    from asp.steps.loaders import policy_model_path
    from asp.steps.paths import LaunchPaths
    from asp.trainers.heldout import heldout_problems

    set_offline_defaults()
    params = load_params_with(Path(args.params), None, [])
    paths = LaunchPaths()
    import pandas as pd

    train = set(pd.read_parquet(paths.prompts)["problem"])
    steps = checkpoint_steps(args.iterations, args.evals)
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    setting = {k: getattr(args, k) for k in ("seeds", "iterations", "evals", "heldout")}
    for seed in args.seeds:
        records, _ = heldout_problems(args.heldout, seed=seed, exclude=train)
        for arm in args.arms:
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory() as tmp, PeakRSS() as mem:
                if arm.startswith("TRL"):
                    r = run_trl(params, paths, seed, args.iterations, steps, arm == "TRL + asp", Path(tmp))
                else:
                    mode = "sync" if "sync" in arm else "async"
                    r = run_asp(params, paths, seed, args.iterations, steps, mode, Path(tmp))
                r["peak_rss_gib"] = mem.peak / 2**30
                r["load_start"], r["load_end"] = load, os.getloadavg()[0]
                evaluate(policy_model_path(paths.policy), records, r, params, seed)
            r["final_heldout_reward"] = r["checkpoints"][-1]["heldout_reward"] if r["checkpoints"] else float("nan")
            r["seed"] = seed
            results[arm].append(r)
            print(f"seed {seed} {arm}: {json.dumps(r)}", file=sys.stderr, flush=True)
            write_json({"setting": {**setting, "checkpoint_steps": steps}, "results": results}, Path(args.out))
        if "TRL" in results and results["TRL"]:
            target = results["TRL"][-1]["final_heldout_reward"]
            for arm in args.arms:
                results[arm][-1]["time_to_trl_reward_s"] = time_to(results[arm][-1]["checkpoints"], target)
    text = summarize(results)
    print(text)
    write_json({"setting": {**setting, "checkpoint_steps": steps}, "results": results, "table": text}, Path(args.out))


if __name__ == "__main__":
    main()
