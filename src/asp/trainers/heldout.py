"""Held-out reward of a demo-task policy: its mean reward on new problems of the built-in task that the GRPO run
never trained on, with the initial weights or with a trainer checkpoint's.

    from asp.trainers.heldout import compare_heldout, final_weights, heldout_problems, heldout_rewards
    records, skipped = heldout_problems(256, seed=0, exclude=set(train["problem"]))
    sampling = {"max_new_tokens": 160, "seed": 0, "temperature": 1.0, "device": "cpu"}  # the runtime params'
    heldout_rewards(model_path, None, records, **sampling).mean                            # 4 samples each
    compare_heldout(model_path, final_weights(state_dir)[0], records, **sampling)           # before/after

The problems come from the task's own generator on a seed of their own (`common.seed` + 900), and any whose
text is among the run's prompts is skipped (short problems have few variants: about half of 256 fresh draws
repeat one of 2,000 training prompts), so the reward is measured on problems the run never saw. Before and
after decode the same problems with the same sampling seed, so their difference is the run's held-out gain.
Used by the launch stage (``grpo/heldout_*`` in metrics/launch.json) and by `asp heldout-reward`.
Tests: tests/trainers/test_heldout.py.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asp.rl import compute_rewards, get_reward
from asp.rollout import load_tokenizer

HELDOUT_SEED_OFFSET = 900  # problems from common.seed + 900 (prepare uses + 1, the policy's warm start + 100)
HELDOUT_SAMPLES = 4  # responses per held-out problem
MAX_DRAW_FACTOR = 64  # give up when this many candidates per wanted problem leave too few new ones


@dataclass(frozen=True)
class HeldoutResult:
    """Rewards of one policy on the held-out problems.

    Attributes:
        per_problem: [n] mean reward of each problem's samples (problem order).
        samples: responses per problem.
        seconds: wall time of the sampling.
    """

    per_problem: np.ndarray
    samples: int
    seconds: float

    @property
    def mean(self) -> float:
        return float(self.per_problem.mean())


def heldout_problems(n: int, *, seed: int, exclude: Collection[str] = ()) -> tuple[list[dict], int]:
    """`n` new demo problems whose text is not in `exclude`, deterministically from `seed`.

    Draws ``m`` candidates with `asp.demo.task.generate_problems` (``seed + HELDOUT_SEED_OFFSET``, ids
    ``heldout-...``), keeps those not in `exclude` and takes the first `n`; m starts at n and doubles while too
    few remain.

    Args:
        n: problems wanted (>= 1).
        seed: the run's base seed (``common.seed``).
        exclude: problem texts to skip (the run's training prompts).

    Returns:
        (records, excluded): the `n` task records (``id``, ``problem``, ``answer``, ``steps``) and how many
        candidates of the final draw were skipped (text in `exclude`) before the n-th one kept.

    Raises:
        ValueError: n < 1, or even ``MAX_DRAW_FACTOR * n`` candidates leave fewer than `n` new problems.
    """
    from asp.demo.task import generate_problems

    if n < 1:
        raise ValueError(f"need at least one held-out problem, got {n}")
    m = n
    while True:
        candidates = generate_problems(m, seed=seed + HELDOUT_SEED_OFFSET, id_prefix="heldout")
        kept = [i for i, r in enumerate(candidates) if r["problem"] not in exclude]
        if len(kept) >= n:
            return [candidates[i] for i in kept[:n]], kept[n - 1] + 1 - n
        if m >= MAX_DRAW_FACTOR * n:
            raise ValueError(
                f"only {len(kept)} of {m} new demo problems are not among the {len(exclude)} excluded prompts; "
                f"ask for fewer than {n} held-out problems"
            )
        m *= 2


def heldout_rewards(
    model_path: str | Path,
    weights: str | Path | None,
    records: Sequence[dict],
    *,
    samples: int = HELDOUT_SAMPLES,
    max_new_tokens: int,
    seed: int,
    temperature: float,
    device: str,
    num_threads: int | None = None,
    batch_size: int = 64,
    reward: str | None = None,
) -> HeldoutResult:
    """Demo reward of the policy at `model_path` (with `weights` loaded over it, if given) on `records`.

    Args:
        model_path: local Hugging Face checkpoint directory of the policy (its tokenizer too).
        weights: a trainer checkpoint's ``model.safetensors`` to load over it, or None for the checkpoint's own.
        records: demo task records (`heldout_problems`).
        samples: responses per problem (pure sampling at `temperature`, as `asp.demo.policy.sample_responses`).
        max_new_tokens: response cap (``runtime.sampling.max_new_tokens``).
        seed: sampling seed (the same for every policy compared).
        temperature: sampling temperature (> 0).
        device: torch device of the model.
        num_threads: torch CPU threads while sampling (None: as is).
        batch_size: prompts per `generate` call.
        reward: the reward that scores each response (`asp.rl.get_reward`: demo, demo_steps, math, pkg.mod:fn;
            None: the demo task's verifier); a response whose reward raises scores 0.

    Returns:
        The per-problem mean rewards and the sampling time.

    Raises:
        FileNotFoundError: `weights` is not a file.
    """
    import torch
    from safetensors.torch import load_model
    from transformers import AutoModelForCausalLM

    from asp.demo.policy import sample_and_score

    model = AutoModelForCausalLM.from_pretrained(
        str(model_path), local_files_only=True, use_safetensors=True, dtype=torch.float32
    )
    if weights is not None:
        if not Path(weights).is_file():
            raise FileNotFoundError(f"{weights}: no such weights file")
        load_model(model, str(weights))
    model = model.to(device).eval()
    fn = get_reward(reward or "demo")

    def score(texts: list[str], answers: list[Any], problems: list[Any]) -> np.ndarray:
        return compute_rewards(fn, texts, [str(a) for a in answers], [str(p) for p in problems])[0]

    t0 = time.perf_counter()
    flat = sample_and_score(
        model,
        load_tokenizer(Path(model_path)),
        records,
        n_samples=samples,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        seed=seed,
        batch_size=batch_size,
        num_threads=num_threads,
        score=score,
    ).rewards
    per_problem = [float(flat[i * samples : (i + 1) * samples].mean()) for i in range(len(records))]
    return HeldoutResult(np.asarray(per_problem, dtype=np.float64), samples, time.perf_counter() - t0)


def compare_heldout(
    model_path: str | Path, weights: str | Path, records: Sequence[dict], **sampling: Any
) -> dict[str, float]:
    """Held-out reward of the policy at `model_path` before and after loading `weights`, on the same `records`
    with the same sampling (`sampling`: `heldout_rewards`' keyword arguments).

    Returns:
        ``reward_before``, ``reward_after``, ``gain`` and ``gain_se`` (`paired_gain`) and ``seconds`` (both).
    """
    before = heldout_rewards(model_path, None, records, **sampling)
    after = heldout_rewards(model_path, weights, records, **sampling)
    gain, se = paired_gain(before.per_problem, after.per_problem)
    return {
        "reward_before": before.mean,
        "reward_after": after.mean,
        "gain": gain,
        "gain_se": se,
        "seconds": before.seconds + after.seconds,
    }


def final_weights(state_dir: str | Path) -> tuple[Path, int] | None:
    """The newest GRPO trainer checkpoint's weights under `state_dir` (``trainer/step-<step>/model.safetensors``)
    and its step, or None when there is none."""
    from asp.trainers.weights import CHECKPOINT_RE, latest_checkpoint

    latest = latest_checkpoint(Path(state_dir) / "trainer")
    if latest is None or not (latest / "model.safetensors").is_file():
        return None
    match = CHECKPOINT_RE.match(latest.name)
    return (latest / "model.safetensors", int(match.group(1))) if match else None


def paired_gain(before: np.ndarray, after: np.ndarray) -> tuple[float, float]:
    """Mean per-problem reward gain after - before and its standard error (std of the differences / sqrt(n)).

    Example: before [0, 0.5, 1], after [0.5, 0.5, 1] -> differences [0.5, 0, 0]: gain 1/6, SE 0.2887 / sqrt(3).
    """
    diff = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    se = float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else float("nan")
    return float(diff.mean()), se
