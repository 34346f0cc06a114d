"""Partial rollouts (``runtime.partial``): responses generated in segments of at most a token budget, and the online
length correction that orders what is continued next. Pure Python + numpy, no Ray, no clock.

With partial rollouts an engine call generates at most ``token_budget`` tokens per response. A task (one scheduled
minibatch) whose responses all finished in its first call goes on as before; otherwise its first output is *held*
here (`PartialStore.hold`) and its unfinished responses wait in the *pool* as continuation rows. The Control Unit
core (`asp.control.core`) hands pooled rows out as continuation items (`WorkItem.rows`, several tasks' rows in one
engine call, to any Generation Unit, decoded with whatever newer weights the actor loaded first) and merges what
comes back (`PartialStore.merge`); a task whose every response finished is assembled into one `MinibatchOutput` and
enters the Training Queue like any other (a prompt's n responses, and a minibatch's prompts, always together).

Per response the store keeps its tokens, their behaviour log-probs (each token's own: the GRPO ratio's
denominator) and its segments as (policy version, tokens). The assembled output's ``policy_version`` is the *oldest*
segment's version, so a response counts against ``max_policy_lag`` by its oldest token and ``stale_samples`` acts on
its whole minibatch (drop: never trained; regenerate: generated again from scratch). ``sample_versions`` keeps each
response's oldest and newest version (``runtime/summary/split_response_share``).

Engine seconds are attributed to responses: a task's first call to its task, a continuation call's seconds and
row-steps (rows x longest new segment) split evenly over its rows, so generation utilization and padding stay sums
over engine calls (`MinibatchOutput.padded_slots`).

**Online length correction** (`expected_final_length`): once some of a prompt's n responses finished, the length of
the others is estimated from those siblings and the schedule's predicted length, as the mean of a log-normal
truncated below at the tokens already generated. ``continuation_order: online`` hands out pooled rows longest
expected remainder first (so continuation items hold rows of similar remainders and the longest start first);
``fifo`` in arrival order. Under a lag bound (``age_first``) rows of the task with the oldest segment go first in
either order, so a long response is continued before it ages out instead of after newer, shorter work.

**Stale held work** (`stale_tasks`): a held task whose oldest segment would be more than ``max_policy_lag`` versions
behind the trainer when its continuation comes back can never train, so it is not continued: the core drops it or
sends it again from scratch (`Database.retire_held`). `length_bucket` puts a prompt in a quarter of ``max_new_tokens``
by its longest response so far, for the per-bucket counts of dropped and regenerated prompts.

Checkpoints: `PartialStore.state` / `restore` (inside `Database.state`): a resumed run continues the held tasks from
their last merged segment; rows that were out at an actor are pooled again. Tests: tests/control/test_partial.py.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from asp.control.messages import ContinuationRow, MinibatchOutput, SegmentOutput

Order = Literal["fifo", "online"]
SIGMA_PRIOR = 0.5  # prior spread of a group's log-lengths (one pseudo-observation)
LENGTH_BUCKETS = ("q1", "q2", "q3", "q4")  # quarters of max_new_tokens, by a prompt's longest response


def length_bucket(longest: int, cap: int) -> str:
    """The quarter of `cap` (``max_new_tokens``) that a prompt's longest response (tokens) falls in: q1 = below a
    quarter, ..., q4 = from three quarters on (a response at the cap included). Example: 300 of cap 1,000 -> q2."""
    if cap <= 0:
        return LENGTH_BUCKETS[-1]
    return LENGTH_BUCKETS[min(len(LENGTH_BUCKETS) - 1, max(0, int(longest) * len(LENGTH_BUCKETS) // int(cap)))]


def prompt_buckets(lengths: np.ndarray, n: int, cap: int, first: int = 0) -> dict[str, int]:
    """Prompts per `length_bucket`, from a minibatch's (prompts x n,) response lengths, prompts `first`.. only."""
    counts: dict[str, int] = {}
    for p in range(first, len(lengths) // max(n, 1)):
        b = length_bucket(int(np.max(lengths[p * n : (p + 1) * n], initial=0)), cap)
        counts[b] = counts.get(b, 0) + 1
    return counts


# ---- online length correction ---------------------------------------------------------------------------
def _phi(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def expected_final_length(
    generated: int,
    finished: Sequence[int],
    predicted: float | None,
    cap: int,
    *,
    prior_weight: float = 1.0,
    sigma_prior: float = SIGMA_PRIOR,
) -> float:
    """Expected final length (tokens) of an unfinished response that already has `generated` tokens.

    The group's log-lengths are modelled as normal with mean ``mu`` = the weighted mean of the finished siblings'
    log-lengths and the predicted length's log (weight `prior_weight`), and variance from their spread plus one
    pseudo-observation of `sigma_prior` squared. The response is known to be longer than `generated`, so the
    estimate is the log-normal's mean truncated below at `generated`:
    ``exp(mu + s^2/2) * Phi((mu + s^2 - ln g) / s) / Phi((mu - ln g) / s)``, clipped to ``[generated + 1, cap]``.
    Without siblings or prediction: twice `generated` (as much again). Far in the tail (the truncated mass below
    1e-12): ``generated * exp(s)``.

    Example: generated 64, siblings [20, 30], no prediction -> mu = ln(24.5), s = sqrt((2 * 0.203^2 + 0.5^2) / 3)
    = 0.333; the truncated mean is 70.8 tokens (a response already past its siblings is expected to end soon).

    Args:
        generated: tokens the response has so far (> 0).
        finished: final lengths of its prompt's finished responses.
        predicted: the schedule's predicted length of the prompt (None or <= 0: unknown).
        cap: ``max_new_tokens``.
        prior_weight: weight of the prediction, in sibling responses.
        sigma_prior: prior spread of log-lengths.
    """
    g = max(int(generated), 1)
    xs = [math.log(max(int(x), 1)) for x in finished]
    ws = [1.0] * len(xs)
    if predicted is not None and predicted > 0:
        xs.append(math.log(predicted))
        ws.append(prior_weight)
    if not xs:
        return float(min(cap, 2 * g))
    total = sum(ws)
    mu = sum(w * x for w, x in zip(ws, xs, strict=True)) / total
    var = (sum(w * (x - mu) ** 2 for w, x in zip(ws, xs, strict=True)) + sigma_prior**2) / (total + 1.0)
    s = math.sqrt(max(var, 1e-6))
    lg = math.log(g)
    tail = _phi((mu - lg) / s)
    est = g * math.exp(s) if tail < 1e-12 else math.exp(mu + s * s / 2) * _phi((mu + s * s - lg) / s) / tail
    return float(min(max(est, g + 1.0), cap))


# ---- held tasks ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class HeldTask:
    """A task whose first output came back with unfinished responses (S = prompts x n responses).

    Attributes:
        head: the first output (provenance, prompt ids, prompt tokens, first call's timing).
        tokens, logprobs: per response, its tokens and behaviour log-probs so far.
        segments: per response, [policy version, tokens] of each segment, in order.
        lengths: (S,) tokens so far; finished, stopped: (S,) bool.
        texts: (S,) decoded responses (final once finished).
        state: (S,) "done" | "pool" | "out" (waiting to be continued / at an actor).
        gen_s: engine seconds attributed to it; gen_end: end of its last segment; padded_slots: row-steps.
        failures: failed continuation attempts of its rows.
    """

    head: MinibatchOutput
    tokens: list[np.ndarray]
    logprobs: list[np.ndarray]
    segments: list[list[list[int]]]
    lengths: np.ndarray
    finished: np.ndarray
    stopped: np.ndarray
    texts: list[str]
    state: list[str]
    gen_s: float
    gen_end: float
    padded_slots: int
    failures: int = 0

    @property
    def n(self) -> int:
        return self.head.n

    @property
    def oldest_version(self) -> int:
        """The policy version of its oldest segment (what its assembled output will count its lag from)."""
        return min((v for seg in self.segments for v, _ in seg), default=self.head.policy_version)

    @property
    def out(self) -> bool:
        """Some of its rows are at an actor now."""
        return "out" in self.state


def _split(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """Cut a flat array into per-row pieces of `lengths` (all empty when `flat` is, as in the simulator)."""
    if flat.size == 0:
        return [flat[:0].copy() for _ in range(len(lengths))]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [flat[bounds[i] : bounds[i + 1]].copy() for i in range(len(lengths))]


@dataclass
class PartialStore:
    """Held tasks, the pool of rows to continue and their order (see the module docstring).

    Attributes:
        tasks: task id -> `HeldTask`.
        pool: (task id, sample) rows waiting to be continued, in arrival order.
        predicted: prompt id -> the current plan's predicted length (for ``order: online``; may be empty); the
            Database updates it when a re-plan brings new loads.
        cap: ``max_new_tokens`` (set by the core; 0 until known).
        age_first: hand out rows of the task with the oldest segment first (set by the core under a lag bound).
    """

    tasks: dict[int, HeldTask] = field(default_factory=dict)
    pool: list[tuple[int, int]] = field(default_factory=list)
    predicted: Mapping[Any, float] = field(default_factory=dict)
    cap: int = 0
    age_first: bool = False

    def __len__(self) -> int:
        return len(self.tasks)

    def hold(self, out: MinibatchOutput) -> None:
        """Keep a task's first output; its unfinished responses join the pool."""
        lengths = out.lengths.astype(np.int64)
        v = out.policy_version
        held = HeldTask(
            head=out,
            tokens=_split(out.token_ids, lengths),
            logprobs=_split(out.logprobs, lengths),
            segments=[[[v, int(x)]] for x in lengths],
            lengths=lengths.copy(),
            finished=out.finished.astype(bool).copy(),
            stopped=out.stopped.astype(bool).copy(),
            texts=list(out.texts) if out.texts else [""] * len(lengths),
            state=["done" if f else "pool" for f in out.finished],
            gen_s=out.gen_s,
            gen_end=out.gen_end,
            padded_slots=len(lengths) * int(lengths.max(initial=0)),
        )
        self.tasks[out.task_id] = held
        self.pool.extend((out.task_id, s) for s in range(len(lengths)) if not held.finished[s])

    # ---- handing rows out --------------------------------------------------------------------------------
    def expected_remaining(self, task_id: int, sample: int) -> float:
        """Online length correction: expected tokens still to come for one pooled row (`expected_final_length`)."""
        held = self.tasks[task_id]
        n, p = held.n, sample // held.n
        siblings = [int(held.lengths[p * n + j]) for j in range(n) if held.finished[p * n + j]]
        pid = held.head.prompt_ids[p]
        g = int(held.lengths[sample])
        return expected_final_length(g, siblings, self.predicted.get(pid), self.cap or 2 * g + 1) - g

    def stale_tasks(self, version: int, bound: int | None) -> list[int]:
        """Held tasks that cannot train: their oldest segment is more than `bound` versions behind `version` (the
        trainer's version when a continuation handed out now can come back at the earliest). None: no bound."""
        if bound is None:
            return []
        return [t for t, h in self.tasks.items() if version - h.oldest_version > bound]

    def take(
        self, max_rows: int, order: Order, prompts: Mapping[Any, str], skip: frozenset[int] = frozenset()
    ) -> list[ContinuationRow]:
        """Up to `max_rows` pooled rows as one continuation item's rows (marked out), in `order` (oldest task first
        when `age_first`); rows of tasks in `skip` stay pooled."""
        if not self.pool or max_rows < 1:
            return []
        if order == "online":
            self.pool.sort(key=lambda r: -self.expected_remaining(*r))  # stable: ties keep arrival order
        if self.age_first:
            oldest = {t: h.oldest_version for t, h in self.tasks.items()}
            self.pool.sort(key=lambda r: oldest[r[0]])  # stable: the order above within a version
        ready = [r for r in self.pool if r[0] not in skip]
        chosen = ready[:max_rows]
        taken = set(chosen)
        self.pool = [r for r in self.pool if r not in taken]
        rows = []
        for task_id, s in chosen:
            held = self.tasks[task_id]
            held.state[s] = "out"
            pid = held.head.prompt_ids[s // held.n]
            rows.append(ContinuationRow(task_id, s, pid, prompts[pid], held.tokens[s], int(held.lengths[s])))
        return rows

    def release(self, rows: Sequence[ContinuationRow], failed: bool) -> int:
        """Put rows of a continuation item that did not come back into the pool again (in front); returns the most
        failed attempts of any of their tasks (counted when `failed`)."""
        worst, back = 0, []
        for r in rows:
            held = self.tasks.get(r.task_id)
            if held is None or held.state[r.sample] != "out":
                continue
            held.state[r.sample] = "pool"
            back.append((r.task_id, r.sample))
        for task_id in {t for t, _ in back}:
            self.tasks[task_id].failures += int(failed)
            worst = max(worst, self.tasks[task_id].failures)
        self.pool[:0] = back
        return worst

    # ---- results -----------------------------------------------------------------------------------------
    def merge(self, seg: SegmentOutput) -> list[MinibatchOutput]:
        """Add a continuation segment to its rows; return the tasks now complete (assembled, removed from the
        store), in the order their last row appears in `seg`."""
        rows = len(seg.task_ids)
        share_s = seg.gen_s / rows if rows else 0.0
        slots = int(seg.lengths.max(initial=0))
        tokens, logprobs = _split(seg.token_ids, seg.lengths), _split(seg.logprobs, seg.lengths)
        touched: list[int] = []
        for i, (task_id, s) in enumerate(zip(seg.task_ids.tolist(), seg.samples.tolist(), strict=True)):
            held = self.tasks.get(task_id)
            if held is None or held.state[s] != "out":
                continue
            k = int(seg.lengths[i])
            held.tokens[s] = np.concatenate([held.tokens[s], tokens[i]])
            held.logprobs[s] = np.concatenate([held.logprobs[s], logprobs[i]])
            held.segments[s].append([seg.policy_version, k])
            held.lengths[s] += k
            held.stopped[s] = bool(seg.stopped[i])
            if seg.texts:
                held.texts[s] = seg.texts[i]
            held.gen_s += share_s
            held.gen_end = max(held.gen_end, seg.gen_end)
            held.padded_slots += slots
            if seg.finished[i]:
                held.finished[s], held.state[s] = True, "done"
            else:
                held.state[s] = "pool"
                self.pool.append((task_id, s))
            if task_id not in touched:
                touched.append(task_id)
        if touched:  # a reload before this call goes on its first task's minibatch record, as gen_s goes
            self.tasks[touched[0]].head.reload_s += seg.reload_s
        done = [t for t in touched if all(st == "done" for st in self.tasks[t].state)]
        return [assemble(self.tasks.pop(t)) for t in done]

    def drop_task(self, task_id: int) -> None:
        """Forget a held task (its rows leave the pool)."""
        self.tasks.pop(task_id, None)
        self.pool = [r for r in self.pool if r[0] != task_id]

    # ---- checkpoint --------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able: every held task with its responses so far (rows out at an actor are saved as pooled)."""
        return {str(t): _held_json(h) for t, h in self.tasks.items()}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Rebuild from `state()`: every unfinished row is pooled (task order, then sample order)."""
        self.tasks.clear()
        self.pool.clear()
        for key, data in state.items():
            held = _held_from_json(data)
            self.tasks[int(key)] = held
            self.pool.extend((int(key), s) for s in range(len(held.state)) if held.state[s] == "pool")


def assemble(held: HeldTask) -> MinibatchOutput:
    """One `MinibatchOutput` of a held task whose responses all finished (policy_version = its oldest segment)."""
    head = held.head
    versions = np.asarray([[min(v for v, _ in seg), max(v for v, _ in seg)] for seg in held.segments], np.int64)
    with_lp = all(lp.size == int(n) for lp, n in zip(held.logprobs, held.lengths, strict=True))
    return MinibatchOutput(
        task_id=head.task_id,
        minibatch_id=head.minibatch_id,
        attempt=head.attempt,
        gu=head.gu,
        actor=head.actor,
        policy_version=int(versions[:, 0].min(initial=head.policy_version)),
        prompt_ids=list(head.prompt_ids),
        n=head.n,
        lengths=held.lengths.astype(np.int32),
        stopped=held.stopped.copy(),
        token_ids=np.concatenate(held.tokens).astype(np.int32) if held.tokens else np.zeros(0, np.int32),
        logprobs=(
            np.concatenate(held.logprobs).astype(np.float32)
            if with_lp and held.logprobs and head.logprobs.size
            else np.zeros(0, np.float32)
        ),
        prompt_tokens=head.prompt_tokens,
        texts=list(held.texts) if head.texts else [],
        gen_start=head.gen_start,
        gen_end=head.gen_start + held.gen_s,
        reload_s=head.reload_s,
        reload_error=head.reload_error,
        sample_versions=versions,
        padded_slots=held.padded_slots,
    )


# ---- JSON (checkpoints) ----------------------------------------------------------------------------------
def _b64(a: np.ndarray, dtype: Any) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode("ascii")


def _unb64(text: str, dtype: Any) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype).copy()


def _held_json(h: HeldTask) -> dict[str, Any]:
    head = h.head
    return {
        "task_id": head.task_id,
        "minibatch_id": head.minibatch_id,
        "attempt": head.attempt,
        "gu": head.gu,
        "actor": head.actor,
        "policy_version": head.policy_version,
        "prompt_ids": list(head.prompt_ids),
        "n": head.n,
        "prompt_tokens": [int(x) for x in head.prompt_tokens],
        "gen_start": head.gen_start,
        "reload_s": head.reload_s,
        "with_logprobs": bool(head.logprobs.size),
        "lengths": [int(x) for x in h.lengths],
        "finished": [bool(x) for x in h.finished],
        "stopped": [bool(x) for x in h.stopped],
        "texts": list(h.texts),
        "segments": h.segments,
        "tokens": _b64(np.concatenate(h.tokens) if h.tokens else np.zeros(0), np.int32),
        "logprobs": _b64(np.concatenate(h.logprobs) if h.logprobs else np.zeros(0), np.float32),
        "gen_s": h.gen_s,
        "gen_end": h.gen_end,
        "padded_slots": h.padded_slots,
        "failures": h.failures,
    }


def _held_from_json(d: Mapping[str, Any]) -> HeldTask:
    lengths = np.asarray(d["lengths"], np.int64)
    tokens, logprobs = _unb64(d["tokens"], np.int32), _unb64(d["logprobs"], np.float32)
    finished = np.asarray(d["finished"], bool)
    head = MinibatchOutput(
        task_id=int(d["task_id"]),
        minibatch_id=int(d["minibatch_id"]),
        attempt=int(d["attempt"]),
        gu=int(d["gu"]),
        actor=int(d["actor"]),
        policy_version=int(d["policy_version"]),
        prompt_ids=list(d["prompt_ids"]),
        n=int(d["n"]),
        lengths=lengths.astype(np.int32),
        stopped=np.asarray(d["stopped"], bool),
        token_ids=tokens,
        logprobs=logprobs if d["with_logprobs"] else np.zeros(0, np.float32),
        prompt_tokens=np.asarray(d["prompt_tokens"], np.int32),
        texts=list(d["texts"]),
        gen_start=float(d["gen_start"]),
        gen_end=float(d["gen_end"]),
        reload_s=float(d["reload_s"]),
        finished=finished,
    )
    return HeldTask(
        head=head,
        tokens=_split(tokens, lengths),
        logprobs=_split(logprobs, lengths),
        segments=[[list(map(int, seg)) for seg in s] for s in d["segments"]],
        lengths=lengths,
        finished=finished.copy(),
        stopped=np.asarray(d["stopped"], bool),
        texts=list(d["texts"]),
        state=["done" if f else "pool" for f in finished],
        gen_s=float(d["gen_s"]),
        gen_end=float(d["gen_end"]),
        padded_slots=int(d["padded_slots"]),
        failures=int(d["failures"]),
    )
