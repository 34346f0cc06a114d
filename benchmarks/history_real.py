"""Benchmark: history-aware loads on real answer lengths, pass by pass (issue 35 §5).

What `runtime.history` does in a launch, replayed offline on real lengths: every pass over the prompts is scheduled
on the loads the Control Unit would have at the pass boundary, and each pass's schedule is run in the simulator.

Data: data/alpaca_eval_lengths.json (805 AlpacaEval instructions; each real chat model's one answer per prompt, in
whitespace words). Successive policies (a chain): pass 1 is the model the predictor was trained on, passes 2 and 3
its sibling (phi-2-sft -> phi-2-dpo, Qwen1.5-7B-Chat -> Qwen1.5-14B-Chat, tulu-2-dpo-7b -> tulu-2-dpo-13b).
The predictor: the real text predictor's out-of-fold calibrated predictions for the pass-1 model
(benchmarks/results/predictor_real_oof.json, benchmarks/predictor_real.py: MiniLM, 5 folds; no retraining here).

How n samples per prompt are modelled (the data has ONE answer per model and prompt): a model's answer length
a_p (words x 1.3 tokens per word) is taken as prompt p's mean under that policy, and each pass draws n fresh
samples a_p * exp(sigma * e - sigma^2 / 2), e ~ N(0, 1), rounded and capped at 8,192 tokens; sigma is bisected so
that one sample of a model ranks another sample of the same model at Kendall tau ``--sample-tau`` (0.70: the
issue's measured 0.64-0.76 for one earlier sample of the same model). A pass's realized load per prompt is the
mean of its n samples; every tau below is against it.

What the boundary knows: pass p is planned when the last minibatch of pass p-1 is issued, when the in-flight
window (q_max + units x (gu_queue_target + actors) x b prompts, the last ones dispatched) is not trained yet; those
prompts have only older visits. Visits are aged in policy versions (one per global batch). The GPU layout needs
more prompts than 805 to be more than a few steps: the prompt set is the 805 prompts repeated ``--gpu-copies``
times (default 20: 16,100, DeepScaleR's size). With ``--copy-mode shuffle`` (default) copy c >= 1 of a prompt keeps
its predictions but takes the real lengths (under both policies) of another prompt from the same bin of
``--copy-bin`` (16) prompts adjacent in prediction order: a distinct prompt the predictor cannot tell from its
neighbours, as in a real 16k-prompt set. ``--copy-mode exact`` repeats each prompt as it is, which flatters the
predictor-only schedule (a minibatch cut from one prediction's tie holds copies of one prompt, equal in length);
``--copy-sigma`` also gives each copy its own length factor, unseen by the predictor. Equal loads sort by the raw
prediction (as the scheduler breaks ties of the calibrated ones), then at random.

How the policy moves (``--drift``): "abrupt" (default) is the pass-1 model, then its sibling from pass 2 on (pass 2
sees a whole preference-tuning or scale-up step, pass 3 revisits under the same policy); "gradual" moves every
prompt's mean geometrically from the pass-1 model to the sibling over the passes (pass 2 half way), so each pass
sees part of the change, as successive passes of one RL run do.

Catch-up (``runtime.history.catch_up``, on unless ``--no-catch-up``): once the window has trained, the part of
pass p not issued meanwhile (all but its first batch groups holding ``window`` prompts) is scheduled again on the
loads the history gives then; "tau blend" and C4 hist are then those of the plan that runs (boundary head + rest).

Loads: predictor only (C4 on the calibrated predictions, what asp does without history), history only (kappa 0:
the prediction only where a prompt has no visit; at the boundary) and blended (`runtime.history` defaults, kappa
0.5, delta 0.01).
Schedules: C0 original order (fixed minibatches of b), C4 on predictor loads, C4 on blended loads; padding rate
and group-load CV on the pass's realized loads (`asp.schedule.schedule_metrics`). ``tau ceiling``: the previous
pass's policy's true means ranking this pass, what perfect knowledge of the previous pass would give (no sampling
noise, no in-flight window). Simulator
(`asp.sim.engine.simulate`, one pass each): the layouts of params.yaml (demo: 1 GU x 2 actors, batch 16) and of
configs/gpu-cluster.yaml (3 GUs x 4 actors, batch 512, q_max 2,048, lag bound 2), both with bench_sim's ASSUMED
vLLM-like continuous-batching time model and trainer (no GPU measured them) and the cap 8,192 tokens; balancing
with ``--anneal`` proposals. ``--time-model NAME`` simulates with a published-source preset of `asp.sim.presets`
instead (e.g. h100-qwen3-8b, the GPU preset's policy on H100s) and adds, per row, the range of C4's iteration time
over C0's across the preset's sensitivity grid (`SENSITIVITY_GRID`: decode, trainer and reload costs x0.5-4, 13
points; both simulated at the same point).

    .venv/bin/python benchmarks/history_real.py                      # 3 chains x 2 layouts x 3 passes, ~3-6 min
    .venv/bin/python benchmarks/history_real.py --chains phi --layouts demo --passes 2      # a quick look
    .venv/bin/python benchmarks/history_real.py --json benchmarks/results/history_real.json
    .venv/bin/python benchmarks/history_real.py --drift gradual --json benchmarks/results/history_real_gradual.json
    .venv/bin/python benchmarks/history_real.py --plot docs/img/history_real_abrupt.png   # tau and C4/C0 per pass
    .venv/bin/python benchmarks/history_real.py --layouts gpu --time-model h100-qwen3-8b   # sourced, with ranges
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from asp.sim.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_sim's assumed time models

DATA = ROOT / "data" / "alpaca_eval_lengths.json"
OOF = ROOT / "benchmarks" / "results" / "predictor_real_oof.json"
ASSUMED = "assumed"  # --time-model: benchmarks/bench_sim.py's assumed vLLM-like model and trainer
CHAINS = {
    "phi": ("phi-2-sft", "phi-2-dpo"),
    "qwen": ("Qwen1.5-7B-Chat", "Qwen1.5-14B-Chat"),
    "tulu": ("tulu-2-dpo-7b", "tulu-2-dpo-13b"),
}
TOKENS_PER_WORD, CAP = 1.3, 8192


@dataclass(frozen=True)
class Layout:
    name: str
    settings: Any  # ControlSettings, one pass, history off (the benchmark plans every pass itself)
    b: int
    kappa: int
    k: int
    copies: int

    @property
    def window(self) -> int:
        """Prompts dispatched but not trained when a pass's last minibatch is issued."""
        s = self.settings
        return s.q_max + s.generation_units * (s.gu_queue_target + s.actors_per_unit) * self.b


def layout(name: str, copies: int) -> Layout:
    from asp.config import deep_merge, read_yaml
    from asp.runtime.config import RuntimeConfig

    raw = read_yaml(ROOT / "params.yaml")
    if name == "gpu":
        raw = deep_merge(raw, read_yaml(ROOT / "configs/gpu-cluster.yaml"))
    runtime = {**raw["runtime"], "iterations": None}
    runtime["sampling"] = {**runtime["sampling"], "max_new_tokens": CAP}
    settings = RuntimeConfig(**runtime, seed=0).control_settings()  # no schedule settings: history off
    sched = raw["schedule"]
    return Layout(name, settings, sched["b"], sched["kappa"], sched["k"], copies if name == "gpu" else 1)


def sample_sigma(means: np.ndarray, target: float, seed: int) -> float:
    """sigma whose two independent samples per prompt rank each other at Kendall tau `target` (bisection)."""
    from asp.predictor.metrics import kendall_tau

    rng = np.random.default_rng(seed)
    e1, e2 = rng.standard_normal((2, means.size))
    lo, hi = 0.0, 3.0
    for _ in range(30):
        mid = (lo + hi) / 2
        tau = kendall_tau(means * np.exp(mid * e1), means * np.exp(mid * e2))
        lo, hi = (mid, hi) if tau > target else (lo, mid)
    return (lo + hi) / 2


def draw(means: np.ndarray, n: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """(P, n) sample lengths around `means` (tokens), mean-preserving lognormal noise, in [1, CAP]."""
    noise = np.exp(sigma * rng.standard_normal((means.size, n)) - sigma**2 / 2)
    return np.clip(np.round(means[:, None] * noise), 1, CAP).astype(np.int32)


def chain_inputs(
    chain: str, copies: int, copy_sigma: float, seed: int, copy_mode: str = "shuffle", copy_bin: int = 16
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(calibrated predictions (P,), raw predictions (P,), [pass-1 model means, sibling means]) in tokens, the
    prompts repeated `copies` times.

    Copy 0 is the data. `copy_mode` "exact": every copy has its prompt's prediction and true means (a minibatch cut
    from one prediction then holds few distinct prompts, which flatters predictor-only loads: real distinct prompts
    with equal predictions differ). "shuffle": copy c >= 1 keeps its prompt's predictions but takes the true means
    (under both policies: the real drift of one real prompt) of a prompt drawn without replacement from the same
    bin of `copy_bin` prompts adjacent in calibrated-prediction order, so each copy is a distinct prompt the
    predictor cannot tell from its neighbours, and the predictor ranks the copies about as well as the data. With
    `copy_sigma` > 0 each copy's means (both policies) also get a factor exp(copy_sigma * z - s^2/2)."""
    rows = json.loads(DATA.read_text())["rows"]
    source, sibling = CHAINS[chain]
    oof = json.loads(OOF.read_text())["targets"][source]
    idx = np.asarray(oof["prompt_index"])
    pred = np.asarray(oof["calibrated"], float) * TOKENS_PER_WORD
    raw = np.asarray(oof["prediction"], float) * TOKENS_PER_WORD
    means = [np.array([rows[i][f"words:{m}"] for i in idx], float) * TOKENS_PER_WORD for m in (source, sibling)]
    rng = np.random.default_rng([seed, 0xC0])
    source_rows = [np.arange(idx.size)]
    order = np.lexsort((np.arange(idx.size), raw, pred))  # what the scheduler sorts by
    for _ in range(1, copies):
        rows_c = np.arange(idx.size)
        if copy_mode == "shuffle":
            for start in range(0, idx.size, copy_bin):
                members = order[start : start + copy_bin]
                rows_c[members] = rng.permutation(members)
        source_rows.append(rows_c)
    src = np.concatenate(source_rows)
    factor = np.ones(src.size)
    if copies > 1 and copy_sigma > 0:
        factor = np.exp(copy_sigma * rng.standard_normal(src.size) - copy_sigma**2 / 2)
    return np.tile(pred, copies), np.tile(raw, copies), [np.maximum(m[src] * factor, 1.0) for m in means]


def pass_means(models: list[np.ndarray], p: int, passes: int, drift: str) -> np.ndarray:
    """Per-prompt mean lengths under pass `p`'s policy (0-based). "abrupt": the pass-1 model, then the sibling from
    pass 2 on. "gradual": the policy moves from the pass-1 model to the sibling over the run, each prompt's mean
    interpolated geometrically, exp((1 - t) log a + t log b) with t = p / (passes - 1)."""
    if drift == "abrupt":
        return models[min(p, 1)]
    t = p / max(passes - 1, 1)
    return np.exp((1 - t) * np.log(models[0]) + t * np.log(models[1]))


def schedules(ids: np.ndarray, loads: dict[str, np.ndarray], lay: Layout, seed: int, anneal: int) -> dict[str, Any]:
    from asp.schedule import condition_schedule

    kw = {"b": lay.b, "kappa": lay.kappa, "k": lay.k, "seed": seed}
    return {
        "C0": condition_schedule(ids, loads["pred"], "C0", **kw),
        "C4 pred": condition_schedule(ids, loads["pred"], "C4", iterations=anneal, **kw, method="asp"),
        "C4 hist": condition_schedule(ids, loads["blend"], "C4", iterations=anneal, **kw, method="asp"),
    }


def catch_up(
    plan: Any,
    boundary: np.ndarray,
    pred: np.ndarray,
    tiebreak: np.ndarray,
    history: Any,
    version: int,
    estimator: Any,
    lay: Layout,
    seed: int,
    anneal: int,
) -> tuple[Any, np.ndarray]:
    """The pass plan (a `WorkPlan`) once the boundary's in-flight window has trained: its first batch groups holding
    `lay.window` prompts were issued meanwhile and stay; the rest is scheduled again (C4) on the loads the history
    gives now. Returns the plan and the loads each prompt was scheduled on."""
    from asp.control.plan import WorkPlan
    from asp.schedule import condition_schedule

    mbs, groups = plan.minibatches, plan.group_ids
    issued, cut = 0, 0
    while cut < len(mbs) and issued < lay.window:
        group = groups[cut]
        while cut < len(mbs) and groups[cut] == group:
            issued += len(mbs[cut])
            cut += 1
    rest = np.array([i for mb in mbs[cut:] for i in mb], dtype=np.int64)
    loads = boundary.copy()
    if rest.size == 0:
        return plan, loads
    loads[rest] = history.loads([int(i) for i in rest], pred[rest], version, estimator)
    kw = {"b": lay.b, "kappa": lay.kappa, "k": lay.k, "seed": seed}
    tail = WorkPlan.from_schedule(
        condition_schedule(rest, loads[rest] * tiebreak[rest], "C4", iterations=anneal, **kw, method="asp")
    )
    first = groups[cut - 1] + 1 if cut else 0
    merged = [*mbs[:cut], *tail.minibatches], [*groups[:cut], *(first + g for g in tail.group_ids)]
    return WorkPlan.from_lists(*merged), loads


def run_chain(chain: str, lay: Layout, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One chain at one layout: per pass the loads at its boundary, the schedules, their metrics and simulations."""
    from bench_sim import TRAIN, assumed_generation_model

    from asp.control.plan import WorkPlan
    from asp.predictor.metrics import kendall_tau
    from asp.schedule import schedule_metrics
    from asp.schedule.history import HistoryEstimator, LengthHistory
    from asp.sim.engine import Workload, simulate
    from asp.sim.presets import SENSITIVITY_GRID, get_preset, scaled_models

    if args.time_model == ASSUMED:
        gen, train, grid = assumed_generation_model(), TRAIN, []
    else:
        preset = get_preset(args.time_model)
        gen, train = preset.gen, preset.train
        grid = [scaled_models(gen, train, scale) for scale in SENSITIVITY_GRID]
    pred, raw, models = chain_inputs(chain, lay.copies, args.copy_sigma, args.seed, args.copy_mode, args.copy_bin)
    n, batch = lay.settings.n_samples, lay.settings.global_batch_prompts
    sigma = sample_sigma(models[0], args.sample_tau, args.seed)
    rng = np.random.default_rng([args.seed, lay.copies])
    # equal loads sort as the scheduler sorts them (by the raw prediction, then at random rather than by row: the
    # copies of a prompt would otherwise sit side by side in every tie, which real distinct prompts do not)
    raw_rank = np.unique(raw, return_inverse=True)[1]  # equal raw predictions, equal rank
    tiebreak = 1.0 + 1e-9 * (raw_rank + rng.random(pred.size)) / pred.size
    ids, history = np.arange(pred.size), LengthHistory()
    held: tuple[list[int], np.ndarray, np.ndarray] | None = None  # last pass's window, trained after the boundary
    steps = -(-pred.size // batch)
    blend = HistoryEstimator(args.prior_samples, args.drift_per_version)
    only = replace(blend, prior_samples=0.0)
    out = []
    for p in range(args.passes):
        means = pass_means(models, p, args.passes, args.drift)
        lengths = draw(means, n, sigma, rng)
        realized = lengths.mean(axis=1)
        version = p * steps - lay.window // batch  # the policy version at the boundary (the window not trained)
        loads = {"pred": pred}
        loads["hist"] = history.loads(list(ids), pred, version, only)
        loads["blend"] = history.loads(list(ids), pred, version, blend)
        known = float(np.mean([int(i) in history.visits for i in ids]))  # share of prompts with a visit
        scheds = schedules(ids, {k: v * tiebreak for k, v in loads.items()}, lay, args.seed + p, args.anneal)
        plans = {name: WorkPlan.from_schedule(sched) for name, sched in scheds.items()}
        if held is not None:
            history.add(*held)
            if args.catch_up:  # the window trained: the part of this pass not issued yet is re-planned
                plans["C4 hist"], loads["blend"] = catch_up(
                    plans["C4 hist"],
                    loads["blend"],
                    pred,
                    tiebreak,
                    history,
                    version + lay.window // batch,
                    blend,
                    lay,
                    args.seed + p,
                    args.anneal,
                )
        work = Workload.from_arrays(ids, lengths, np.full(ids.size, 150, np.int32), CAP)
        row: dict[str, Any] = {"chain": chain, "layout": lay.name, "pass": p + 1, "prompts": int(ids.size)}
        row["drift"] = args.drift
        row["known"] = known
        row.update({f"tau {k}": kendall_tau(v, realized) for k, v in loads.items()})
        # the ceiling of any knowledge of the previous pass: its policy's true means (no sampling noise, no window)
        previous = pass_means(models, p - 1, args.passes, args.drift) if p else None
        row["tau ceiling"] = kendall_tau(previous, realized) if previous is not None else None
        for name, plan in plans.items():
            m = schedule_metrics(realized, [np.asarray(mb) for mb in plan.minibatches], k=lay.k)
            start = time.perf_counter()
            sim = simulate(plan, work, gen, train, lay.settings).metrics
            if grid:  # a preset: the same plan at every sensitivity point
                row[f"grid {name}"] = [
                    simulate(plan, work, g, t, lay.settings).metrics["runtime/summary/mean_iteration_time_s"]
                    for g, t in grid
                ]
            print(
                f"[history_real] {chain} {lay.name} pass {p + 1} {name}: {time.perf_counter() - start:.1f} s",
                file=sys.stderr,
            )
            row.update({f"P {name}": m["P"], f"CV {name}": m["CV"]})
            row[f"iter {name}"] = sim["runtime/summary/mean_iteration_time_s"]
        out.append(row)
        # what this pass adds to the history: trained in dispatch order of the C4-hist plan (the one that runs),
        # one policy version per global batch; its last `window` prompts only after the next boundary
        order = np.asarray(plans["C4 hist"].prompt_ids())
        versions = p * steps + np.arange(order.size) // batch
        cut = max(order.size - lay.window, 0)
        history.add([int(i) for i in order[:cut]], lengths[order[:cut]], versions[:cut])
        held = ([int(i) for i in order[cut:]], lengths[order[cut:]], versions[cut:])
    return out


def _trio(row: dict[str, Any], key: str, fmt: str) -> str:
    """``C0 / C4 pred / C4 hist`` values of one metric."""
    return " / ".join(fmt.format(row[f"{key} {c}"]) for c in ("C0", "C4 pred", "C4 hist"))


def _fmt(value: float | None) -> str:
    """A tau with three decimals, "-" for None (pass 1 has no previous pass)."""
    return "-" if value is None else f"{value:.3f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table: one row per chain, layout and pass."""
    head = (
        "| chain | layout | pass | known | tau pred | tau hist | tau blend | tau ceiling | P C0 / C4 pred / C4 hist | "
        "CV C0 / C4 pred / C4 hist | iter s C0 / C4 pred / C4 hist | C4 hist / C0 | C4 pred / C0 |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(
            f"| {r['chain']} | {r['layout']} | {r['pass']} | {r['known']:.2f} | {r['tau pred']:.3f} | "
            f"{r['tau hist']:.3f} | {r['tau blend']:.3f} | {_fmt(r['tau ceiling'])} | {_trio(r, 'P', '{:.3f}')} | "
            f"{_trio(r, 'CV', '{:.4f}')} | "
            f"{_trio(r, 'iter', '{:.2f}')} | {r['iter C4 hist'] / r['iter C0']:.3f}{_range(r, 'C4 hist')} | "
            f"{r['iter C4 pred'] / r['iter C0']:.3f}{_range(r, 'C4 pred')} |"
        )
    return "\n".join(lines)


def _range(row: dict[str, Any], name: str) -> str:
    """`` [min-max]`` of `name`'s iteration time over C0's across the sensitivity grid ("" without a preset)."""
    ratios = [a / b for a, b in zip(row.get(f"grid {name}", []), row.get("grid C0", []), strict=True)]
    return f" [{min(ratios):.3f}-{max(ratios):.3f}]" if ratios else ""


COLORS = {"phi": "#cc6677", "qwen": "#332288", "tulu": "#117733"}


def figure(rows: list[dict[str, Any]], layout_name: str, title: str) -> Any:
    """Two panels over the passes at one layout, a line per chain: the tau of the loads (blended: solid,
    predictor: dashed, the previous pass's ceiling: dotted; the goal 0.60) and C4's mean iteration time over C0's
    (history: solid, predictor: dashed; the goal 0.90)."""
    from matplotlib.lines import Line2D

    from asp.plots.save import plt  # matplotlib with the Agg backend selected

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.6))
    for chain, color in COLORS.items():
        rs = [r for r in rows if r["chain"] == chain and r["layout"] == layout_name]
        if not rs:
            continue
        passes = [r["pass"] for r in rs]
        left.plot(passes, [r["tau blend"] for r in rs], "-o", color=color)
        left.plot(passes, [r["tau pred"] for r in rs], "--", color=color)
        known = [r for r in rs if r["tau ceiling"] is not None]
        ceiling = ([r["pass"] for r in known], [r["tau ceiling"] for r in known])
        left.plot(*ceiling, ":", color=color)
        right.plot(passes, [r["iter C4 hist"] / r["iter C0"] for r in rs], "-o", color=color)
        right.plot(passes, [r["iter C4 pred"] / r["iter C0"] for r in rs], "--", color=color)
    left.axhline(0.6, color="grey", lw=0.8)
    right.axhline(0.9, color="grey", lw=0.8)
    left.set(xlabel="pass", ylabel="Kendall tau of the loads vs realized", title="length knowledge", ylim=(0, 1))
    right.set(xlabel="pass", ylabel="mean iteration time / C0's", title=f"simulated, {layout_name} layout")
    for ax in (left, right):
        ax.set_xticks(sorted({r["pass"] for r in rows}))
        ax.grid(alpha=0.3)
    chains = [Line2D([], [], color=c, lw=2, label=name) for name, c in COLORS.items()]
    styles = [
        Line2D([], [], color="black", ls=ls, label=lab) for ls, lab in (("-", "history-aware"), ("--", "predictor"))
    ]
    exact = Line2D([], [], color="black", ls=":", label="previous pass's true means")
    left.legend(handles=chains + styles + [exact], fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    right.legend(
        handles=chains
        + [
            Line2D([], [], color="black", label="C4, history-aware"),
            Line2D([], [], color="black", ls="--", label="C4, predictor"),
        ],
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=3,
    )
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chains", nargs="+", default=list(CHAINS), choices=list(CHAINS))
    ap.add_argument("--layouts", nargs="+", default=["demo", "gpu"], choices=["demo", "gpu"])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--gpu-copies", type=int, default=20)
    ap.add_argument("--copy-mode", default="shuffle", choices=["shuffle", "exact"], help="gpu: what a copy is")
    ap.add_argument("--copy-bin", type=int, default=16, help="gpu, shuffle: prompts a copy's lengths are drawn from")
    ap.add_argument("--copy-sigma", type=float, default=0.0, help="gpu: log-sd of a copy's own length factor")
    ap.add_argument(
        "--catch-up",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="re-plan the rest of a pass once the boundary's window trained (runtime.history.catch_up)",
    )
    ap.add_argument("--drift", default="abrupt", choices=["abrupt", "gradual"], help="how the policy moves")
    ap.add_argument("--sample-tau", type=float, default=0.70)
    ap.add_argument("--prior-samples", type=float, default=0.5, help="kappa (runtime.history.prior_samples)")
    ap.add_argument("--drift-per-version", type=float, default=0.01, help="delta (runtime.history)")
    ap.add_argument("--anneal", type=int, default=20_000, help="balancing proposals of C4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--time-model",
        default=ASSUMED,
        choices=[ASSUMED, *PRESETS],
        help=f"{ASSUMED} (bench_sim's) or a preset of asp.sim.presets, e.g. h100-qwen3-8b (adds sensitivity ranges)",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None, help="PNG: tau and iteration ratio per pass (GPU layout)")
    args = ap.parse_args(argv)
    rows = []
    for name in args.layouts:
        lay = layout(name, args.gpu_copies)
        for chain in args.chains:
            rows.extend(run_chain(chain, lay, args))
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    if args.plot is not None:
        from asp.plots.save import save_figure

        name = "gpu" if "gpu" in args.layouts else args.layouts[0]
        save_figure(
            figure(rows, name, f"history-aware passes, {args.drift} drift (benchmarks/history_real.py)"), args.plot
        )


if __name__ == "__main__":
    main()
