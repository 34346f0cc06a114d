"""Scheduler performance benchmark (issue 3): DP at n = 1e7 and balancing at N_B = 1e5 / 1e6 / 1e7.

Run:  .venv/bin/python benchmarks/bench_schedule.py            (about a minute; prints Markdown tables)
      .venv/bin/python benchmarks/bench_schedule.py --quick    (smaller sizes, a few seconds)

Times are single-threaded; numba compilation is excluded (every kernel is warmed up first). Both wall-clock and
process CPU time are reported; on a shared machine the CPU time is the fairer number and the "equal budget"
comparisons use it. Minibatch loads for the balancing tables: N_B prompt lengths drawn from the paper's Table 6
families, clipped to [1, 8192], times 32 (a minibatch of 32 length-sorted prompts), in ascending order as the
DP emits them; that order is the initial permutation for the variance reduction.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numba as nb
import numpy as np

from asp.schedule import balance_groups, build_minibatches, group_loads, synthetic_lengths

DISTRIBUTIONS = ("lognormal", "exponential", "pareto", "bimodal")


def table6_loads(name: str, n_b: int, seed: int = 0) -> np.ndarray:
    """Sorted minibatch loads (tokens) for one of the Table 6 families."""
    rng = np.random.default_rng(seed)
    if name == "lognormal":
        x = rng.lognormal(np.log(2000.0), 1.0, n_b)
    elif name == "exponential":
        x = rng.exponential(2500.0, n_b)
    elif name == "pareto":
        x = (rng.pareto(1.5, n_b) + 1.0) * 800.0
    else:
        x = np.where(rng.random(n_b) < 0.5, rng.normal(1500, 400, n_b), rng.normal(6000, 1200, n_b))
    return np.sort(np.clip(x, 1.0, 8192.0)) * 32.0


def timed(fn: Callable[[], Any], repeats: int = 1) -> tuple[float, float, Any]:
    """Best-of-`repeats` (wall s, cpu s, result of the last call)."""
    best_wall = best_cpu = np.inf
    out = None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        best_wall, best_cpu = min(best_wall, time.perf_counter() - w), min(best_cpu, time.process_time() - c)
    return best_wall, best_cpu, out


def cv_and_reduction(loads: np.ndarray, perm: np.ndarray, k: int) -> tuple[float, float]:
    g0 = group_loads(loads, k)[: loads.size // k]
    g = group_loads(loads[perm], k)[: loads.size // k]
    return float(g.std() / g.mean()), float(1.0 - g.var() / g0.var())


@nb.njit(cache=True)
def plain_algorithm_1(lengths, b, kappa):  # pragma: no cover - compiled
    """Baseline: Algorithm 1 as written (full float64 S and dp, int64 prev), for comparison only."""
    n = lengths.shape[0]
    s = np.zeros(n + 1)
    for i in range(n):
        s[i + 1] = s[i] + lengths[i]
    dp = np.full(n + 1, -np.inf)
    dp[0] = 0.0
    prev = np.full(n + 1, -1)
    for i in range(1, n + 1):
        for j in range(max(0, i - (b + kappa)), i - b + 1):
            r = (s[i] - s[j]) / ((i - j) * lengths[i - 1])
            if dp[j] + r > dp[i]:
                dp[i] = dp[j] + r
                prev[i] = j
    count, i = 0, n
    while i > 0:
        i = prev[i]
        count += 1
    return count


def bench_dp(n: int) -> None:
    lengths = np.sort(synthetic_lengths(n, 0))
    build_minibatches(lengths[:1000], 32, 2)
    plain_algorithm_1(lengths[:1000], 32, 2)
    w, c, ends = timed(lambda: build_minibatches(lengths, 32, 2), repeats=3)
    pw, pc, _ = timed(lambda: plain_algorithm_1(lengths, 32, 2), repeats=3)
    print(f"\n### DP (Algorithm 1), n = {n:.0e} sorted lengths, b = 32, kappa = 2 (best of 3)\n")
    print("| implementation | wall (s) | CPU (s) | minibatches |")
    print("|---|---|---|---|")
    print(
        f"| `build_minibatches` (validation + ring-buffer kernel + backtrack) | {w:.3f} | {c:.3f} | {ends.size - 1} |"
    )
    print(f"| plain numba Algorithm 1 (full S/dp/prev arrays) | {pw:.3f} | {pc:.3f} | |")


def run_to_budget(loads: np.ndarray, k: int, method: str, budget: float) -> tuple[int, float, float, np.ndarray]:
    """Largest iteration count whose CPU time fits `budget` (calibrated, then checked); returns its run."""
    _, t0, _ = timed(lambda: balance_groups(loads, k, iterations=0, method=method, seed=0), repeats=3)
    probe = 1_000_000
    _, t1, _ = timed(lambda: balance_groups(loads, k, iterations=probe, method=method, seed=0))
    per_it = max(t1 - t0, 1e-9) / probe
    iters = int(max(budget - t0, 0.0) / per_it)
    for _ in range(4):
        w, c, perm = timed(lambda it=iters: balance_groups(loads, k, iterations=it, method=method, seed=0))
        if c <= 1.1 * budget or iters == 0:
            return iters, w, c, perm
        iters = int(iters * budget / c * 0.95)
    return iters, w, c, perm


def bench_budgets(n_b: int, k: int, budgets: tuple[float, ...]) -> None:
    print(f"\n### Balancing at equal CPU budgets, N_B = {n_b:.0e}, k = {k} (initial order: sorted)\n")
    print("| distribution | budget (s) | method | iterations | M it/s | CPU (s) | wall (s) | var. reduction | CV |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in DISTRIBUTIONS:
        loads = table6_loads(name, n_b)
        cv0, _ = cv_and_reduction(loads, np.arange(n_b), k)
        for budget in budgets:
            for method in ("paper_sa", "asp"):
                iters, w, c, perm = run_to_budget(loads, k, method, budget)
                cv, red = cv_and_reduction(loads, perm, k)
                rate = iters / c / 1e6 if c > 0 else float("nan")
                print(
                    f"| {name} | {budget} | {method} | {iters:.2e} | {rate:.1f} | {c:.4f} | {w:.4f} | "
                    f"{100 * red:.5f}% | {cv:.2e} |"
                )
        for method, label in (
            ("kk", "kk (Karmarkar-Karp, equal sizes)"),
            ("lpt", "lpt (asp's start alone)"),
            ("snake", "snake deal alone"),
        ):
            w, c, perm = timed(
                lambda ld=loads, m=method: balance_groups(ld, k, iterations=0, method=m, seed=0), repeats=3
            )
            cv, red = cv_and_reduction(loads, perm, k)
            print(f"| {name} | - | {label} | - | - | {c:.4f} | {w:.4f} | {100 * red:.5f}% | {cv:.2e} |")
        print(f"| {name} | - | initial (sorted) | - | - | - | - | 0% | {cv0:.2e} |")


def bench_fixed(n_b: int, k: int, iterations: int, methods: tuple[str, ...]) -> None:
    print(f"\n### N_B = {n_b:.0e}, k = {k}, {iterations:.0e} iterations (end to end: `balance_groups` call)\n")
    print("| distribution | method | CPU (s) | wall (s) | var. reduction | CV |")
    print("|---|---|---|---|---|---|")
    for name in DISTRIBUTIONS:
        loads = table6_loads(name, n_b)
        for method in methods:
            w, c, perm = timed(
                lambda ld=loads, m=method: balance_groups(ld, k, iterations=iterations, method=m, seed=0)
            )
            cv, red = cv_and_reduction(loads, perm, k)
            print(f"| {name} | {method} | {c:.3f} | {w:.3f} | {100 * red:.5f}% | {cv:.2e} |")


def bench_paper_units(n_b: int, k: int) -> None:
    """paper_sa with loads divided by their mean: then C = 1 is a real temperature and Table 6's plateaus appear."""
    print(f"\n### paper_sa on mean-normalised loads (C = 1), N_B = {n_b:.0e}, k = {k}: variance reduction\n")
    its = (10_000, 89_000, 270_000, 800_000, 2_400_000)
    print("| distribution | " + " | ".join(f"{i:.1e}" for i in its) + " |")
    print("|---|" + "---|" * len(its))
    for name in DISTRIBUTIONS:
        loads = table6_loads(name, n_b)
        norm = loads / loads.mean()
        cells = [
            cv_and_reduction(norm, balance_groups(norm, k, iterations=i, method="paper_sa", seed=0), k)[1] for i in its
        ]
        print(f"| {name} | " + " | ".join(f"{100 * r:.1f}%" for r in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    args = parser.parse_args()
    scale = 100 if args.quick else 1
    warm = table6_loads("lognormal", 1000)
    for method in ("asp", "paper_sa", "kk"):
        balance_groups(warm, 10, iterations=1000, method=method, seed=0)
    print(f"numba {nb.__version__}, numpy {np.__version__}; CPU-time budgets; compilation excluded")
    bench_dp(10_000_000 // scale)
    bench_budgets(100_000 // scale, 10, (0.01, 0.1, 1.0) if not args.quick else (0.001, 0.01))
    bench_fixed(1_000_000 // scale, 10, 2_000_000 // scale, ("paper_sa", "asp", "kk", "lpt"))
    bench_fixed(10_000_000 // scale, 10, 2_000_000 // scale, ("paper_sa", "asp", "lpt"))
    bench_paper_units(100_000 // scale, 10)


if __name__ == "__main__":
    main()
