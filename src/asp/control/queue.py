"""Training Queue and backpressure (paper §4.1, appendix B.3-B.4). Pure Python + numpy, no Ray.

`TrainingQueue` stores completed minibatches in arrival order and cuts global batches of
`global_batch_prompts` prompts from its head; a prompt is the unit, so all n responses of a prompt always
land in the same batch (a minibatch may be split across two batches). It records the depth (prompts)
just before every arrival (`Q_arrival` of the paper's lag estimate) and after every change.

`Backpressure` turns the depth into the sender's pause signal with hysteresis: pause when the depth goes
above `q_max`, resume once it is at or below `q_resume`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from asp.control.messages import GlobalBatch, MinibatchOutput


@dataclass(slots=True)
class _Entry:
    out: MinibatchOutput
    taken: int  # prompts of `out` already handed to the trainer
    offsets: np.ndarray  # (S + 1,) token offset of each sample inside out.token_ids


class TrainingQueue:
    """FIFO of completed minibatches, consumed as global batches counted in prompts.

    Args:
        global_batch_prompts: prompts per training step (B).
        n_samples: responses per prompt (n); every output must have this n.

    Attributes:
        arrivals: (time, depth in prompts just before the arrival, prompts arriving) per `put`.
        trace: (time, depth in prompts after the change) at every put and take.
    """

    def __init__(self, global_batch_prompts: int, n_samples: int) -> None:
        if global_batch_prompts < 1 or n_samples < 1:
            raise ValueError(
                f"global_batch_prompts and n_samples must be >= 1, got {global_batch_prompts}, {n_samples}"
            )
        self.batch, self.n = global_batch_prompts, n_samples
        self.entries: deque[_Entry] = deque()
        self.depth = 0
        self.arrivals: list[tuple[float, int, int]] = []
        self.trace: list[tuple[float, int]] = []

    @property
    def depth_samples(self) -> int:
        return self.depth * self.n

    def ready(self) -> bool:
        """True when a full global batch is waiting."""
        return self.depth >= self.batch

    def put(self, out: MinibatchOutput, now: float) -> int:
        """Append a completed minibatch; return the depth (prompts) just before it arrived."""
        if out.n != self.n or out.lengths.shape[0] != out.num_prompts * self.n:
            raise ValueError(
                f"minibatch task {out.task_id} has n={out.n} and {out.lengths.shape[0]} samples for "
                f"{out.num_prompts} prompts; the queue expects n={self.n}"
            )
        before = self.depth
        out.depth_at_arrival = before / self.batch
        self.entries.append(_Entry(out, 0, sample_offsets(out.lengths)))
        self.depth += out.num_prompts
        self.arrivals.append((now, before, out.num_prompts))
        self.trace.append((now, self.depth))
        return before

    def take(self, step: int, now: float, limit: int | None = None) -> tuple[GlobalBatch, list[tuple[int, int]]]:
        """Cut the next global batch from the head.

        Args:
            step: 1-based trainer step the batch is for.
            now: time of the take (for the depth trace).
            limit: prompts to take (default: one global batch); fewer are taken if fewer are queued.

        Returns:
            (batch, consumed): the batch and, per contributing task in order, (task_id, prompts taken).
        """
        want = min(self.batch if limit is None else limit, self.depth)
        pieces: list[tuple[MinibatchOutput, int, int, np.ndarray]] = []
        while want > 0:
            entry = self.entries[0]
            k = min(want, entry.out.num_prompts - entry.taken)
            pieces.append((entry.out, entry.taken, entry.taken + k, entry.offsets))
            entry.taken += k
            want -= k
            if entry.taken == entry.out.num_prompts:
                self.entries.popleft()
        taken = sum(hi - lo for _, lo, hi, _ in pieces)
        self.depth -= taken
        self.trace.append((now, self.depth))
        return assemble_batch(step, self.n, pieces), [(out.task_id, hi - lo) for out, lo, hi, _ in pieces]

    def evict_older(self, min_version: int, now: float) -> list[tuple[int, int]]:
        """Remove every queued minibatch generated with a policy version below `min_version` (bounded lag).

        Returns:
            (task_id, prompts removed) per evicted minibatch, in queue order (prompts already taken into an
            earlier batch stay trained; only the untaken rest is removed).
        """
        evicted = [
            (e.out.task_id, e.out.num_prompts - e.taken) for e in self.entries if e.out.policy_version < min_version
        ]
        if evicted:
            self.entries = deque(e for e in self.entries if e.out.policy_version >= min_version)
            self.depth -= sum(count for _, count in evicted)
            self.trace.append((now, self.depth))
        return evicted


def sample_offsets(lengths: np.ndarray) -> np.ndarray:
    """(S + 1,) int64 token offset of each of S samples of `lengths` tokens in their concatenated token ids."""
    offsets = np.zeros(lengths.shape[0] + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def assemble_batch(step: int, n: int, pieces: list[tuple[MinibatchOutput, int, int, np.ndarray]]) -> GlobalBatch:
    """Concatenate prompt ranges [lo, hi) of outputs (with their token offsets) into one `GlobalBatch`."""
    prompt_ids: list[Any] = []
    texts: list[str] = []
    cols: dict[str, list[np.ndarray]] = {
        k: [] for k in ("task", "mb", "gu", "actor", "ver", "len", "stop", "tok", "lp", "pt", "gen", "rel", "q")
    }
    for out, lo, hi, offsets in pieces:
        k, s0, s1 = hi - lo, lo * n, hi * n
        t0, t1 = int(offsets[s0]), int(offsets[s1])
        prompt_ids.extend(out.prompt_ids[lo:hi])
        texts.extend(out.texts[s0:s1])
        for key, ivalue in (("task", out.task_id), ("mb", out.minibatch_id), ("gu", out.gu), ("actor", out.actor)):
            cols[key].append(np.full(k, ivalue, np.int64))
        cols["ver"].append(np.full(k, out.policy_version, np.int64))
        for key, fvalue in (("gen", out.gen_s), ("rel", out.reload_s), ("q", out.depth_at_arrival)):
            cols[key].append(np.full(k, fvalue, np.float64))
        cols["len"].append(out.lengths[s0:s1])
        cols["stop"].append(out.stopped[s0:s1])
        cols["tok"].append(out.token_ids[t0:t1])
        cols["lp"].append(out.logprobs[t0:t1] if out.logprobs.size else np.zeros(0, np.float32))
        cols["pt"].append(out.prompt_tokens[lo:hi])

    def cat(key: str, dtype: Any) -> np.ndarray:
        return np.concatenate(cols[key]).astype(dtype, copy=False) if cols[key] else np.zeros(0, dtype)

    lengths = cat("len", np.int32)
    offsets = sample_offsets(lengths)
    return GlobalBatch(
        step=step,
        prompt_ids=prompt_ids,
        task_ids=cat("task", np.int64),
        minibatch_ids=cat("mb", np.int64),
        gus=cat("gu", np.int64),
        actors=cat("actor", np.int64),
        versions=cat("ver", np.int64),
        n=n,
        lengths=lengths,
        stopped=cat("stop", bool),
        sample_offsets=offsets,
        token_ids=cat("tok", np.int32),
        logprobs=cat("lp", np.float32),
        prompt_tokens=cat("pt", np.int32),
        texts=texts,
        gen_s=cat("gen", np.float64),
        reload_s=cat("rel", np.float64),
        depth_at_arrival=cat("q", np.float64),
    )


class Backpressure:
    """Pause signal with hysteresis: paused once depth > q_max, resumed once depth <= q_resume (prompts).

    Attributes:
        paused: current state.
        pauses: number of pause events so far.
    """

    def __init__(self, q_max: int, q_resume: int) -> None:
        if not 0 <= q_resume <= q_max:
            raise ValueError(f"need 0 <= q_resume <= q_max, got q_resume={q_resume}, q_max={q_max}")
        self.q_max, self.q_resume = q_max, q_resume
        self.paused = False
        self.pauses = 0

    def update(self, depth: int) -> bool:
        """Feed the current depth; return True when the paused state changed."""
        if not self.paused and depth > self.q_max:
            self.paused = True
            self.pauses += 1
            return True
        if self.paused and depth <= self.q_resume:
            self.paused = False
            return True
        return False
