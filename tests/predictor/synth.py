"""Demo-like prompt/length pairs for predictor tests and the benchmark (no policy needed).

Prompts come from ``asp.demo.task.generate_problems`` (running sums, heavy-tailed 1..24 terms). Each prompt's
target imitates a profiled mean over ``samples`` sampled responses of a partly trained policy: most samples
have the reference length ``6 * steps + 9``, with jitter; some stop early, some ramble up to the cap.
"""

from __future__ import annotations

import numpy as np

from asp.demo.task import generate_problems, intended_length


def make_sum_prompts(
    n: int,
    *,
    seed: int,
    samples: int = 8,
    cap: int = 256,
    p_early: float = 0.1,
    p_ramble: float = 0.05,
    return_steps: bool = False,
) -> tuple[np.ndarray, ...]:
    """Return ``n`` prompt texts (object array) and their noisy mean response lengths in tokens (float64 [n]).

    With ``return_steps`` also the number of terms per prompt (int [n]), the noise-free driver of length.
    """
    recs = generate_problems(n, seed=seed)
    rng = np.random.default_rng(seed + 1)
    texts = [r["problem"] for r in recs]
    base = np.array([intended_length(r) for r in recs], dtype=np.float64)[:, None]  # [n, 1]
    lengths = base + rng.normal(0.0, 3.0, size=(n, samples))
    early = rng.random((n, samples)) < p_early
    lengths = np.where(early, base * rng.uniform(0.2, 1.0, size=(n, samples)), lengths)
    ramble = rng.random((n, samples)) < p_ramble
    lengths = np.where(ramble, rng.uniform(base, cap, size=(n, samples)), lengths)
    lengths = np.clip(np.rint(lengths), 1, cap)
    out = (np.array(texts, dtype=object), lengths.mean(axis=1))
    return (*out, np.array([r["steps"] for r in recs])) if return_steps else out
