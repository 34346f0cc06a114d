"""Typed messages between the runtime's parts (Control Unit, Generation Units, actors, Training Queue/Unit).

Every completed minibatch travels as one `MinibatchOutput` whose per-sample data are flat numpy columns
(lengths, token ids, behaviour log-probs) rather than one Python object per sample: one Ray message per
minibatch, cheap to pickle, and the trainer can slice it without copying per token. Each output carries
its prompt ids, task / minibatch id, generation unit and actor, and the policy version that produced it.
`GlobalBatch` is the same layout over the prompts of one training step.

`SamplingParams` is not here: it is the rollout layer's (`asp.rollout.base.SamplingParams`, also re-exported by
`asp.runtime`); the runtime sends it once to each generation actor, and the actor sets each minibatch's seed from its
`WorkItem`. This module is part of the Control Unit core (`asp.control`); `asp.runtime` re-exports its names.

This module imports neither torch nor ray, so the Control Unit and Generation Unit processes stay light.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class WorkItem:
    """One minibatch to generate (one `Engine.generate` call).

    Attributes:
        task_id: unique id of this unit of work in the run: ``epoch * n_minibatches + dispatch_rank``.
        minibatch_id: the scheduler's minibatch id (rank in length-sorted order).
        group_id: the scheduler's batch group (dispatch unit) it belongs to.
        attempt: 0 for the first send, +1 for every re-issue after a failure.
        prompt_ids: (P,) prompt ids in schedule order (a resumed, partly trained minibatch keeps only the rest).
        prompts: (P,) chat-templated prompt texts, same order.
        seed: sampling seed; the same for every attempt, so a re-issued minibatch samples the same way.
        budget: partial rollouts (``runtime.partial``): tokens per response this call may generate at most (None:
            up to ``max_new_tokens``); a response that reaches it unfinished comes back as continuation work.
        rows: a *continuation item* (partial rollouts): the unfinished responses to continue, from one or more
            tasks; then `task_id` is the continuation's own id (`SegmentOutput.cont_id`), `prompt_ids` / `prompts`
            are empty and `minibatch_id` / `group_id` are -1.
    """

    task_id: int
    minibatch_id: int
    group_id: int
    attempt: int
    prompt_ids: list[Any]
    prompts: list[str]
    seed: int
    budget: int | None = None
    rows: list[ContinuationRow] = field(default_factory=list)

    @property
    def is_continuation(self) -> bool:
        return bool(self.rows)


@dataclass(slots=True)
class ContinuationRow:
    """One unfinished response to continue (partial rollouts): its prompt and the tokens generated so far.

    Attributes:
        task_id: the task (minibatch) it belongs to.
        sample: its sample index in that task's output (prompt ``sample // n``, response ``sample % n``).
        prompt_id, prompt: its prompt id and chat-templated text.
        token_ids: (g,) int32 response tokens generated so far (empty in the simulator, which counts only `generated`).
        generated: g, the response's length so far in tokens.
    """

    task_id: int
    sample: int
    prompt_id: Any
    prompt: str
    token_ids: np.ndarray
    generated: int


@dataclass(slots=True)
class WeightUpdate:
    """A new policy snapshot announced by the Training Unit.

    Attributes:
        version: policy version after the training step that produced it (trainer step count).
        payload: what the actor loads: None for the simulated trainer, else an ObjectRef to / a mapping of
            tensors, or a path to a safetensors file (see `generation.resolve_weights`).
        simulated_load_s: seconds an actor sleeps to model the reload when `payload` is None.
    """

    version: int
    payload: Any = None
    simulated_load_s: float = 0.0


@dataclass(slots=True)
class MinibatchOutput:
    """The generated samples of one minibatch, as flat columns (S = P * n samples, T = total tokens).

    Attributes:
        task_id, minibatch_id, attempt: copied from the `WorkItem`.
        gu: generation unit index; actor: global generation actor index.
        policy_version: weights version the actor generated with.
        prompt_ids: (P,) prompt ids; sample s belongs to prompt ``s // n``.
        n: samples per prompt.
        lengths: (S,) int32 response lengths in tokens.
        stopped: (S,) bool, True when EOS ended the sample (False: hit max_new_tokens).
        token_ids: (T,) int32 response tokens of all samples, concatenated in sample order.
        logprobs: (T,) float32 behaviour log-probs of those tokens (empty if the engine gave none).
        prompt_tokens: (P,) int32 prompt lengths in tokens.
        texts: (S,) decoded responses.
        gen_start, gen_end: wall-clock (time.time) bounds of the engine call, seconds.
        reload_s: seconds spent reloading weights just before this minibatch (0 if none); with partial rollouts,
            also the reloads just before a continuation whose first row is one of its responses.
        reload_error: why loading the offered snapshot failed ("" if none; the actor kept its weights).
        depth_at_arrival: Training Queue depth in global batches just before it arrived (set by the queue).
        finished: partial rollouts: (S,) bool, False for a response that reached the call's token budget unfinished
            (its task is then held until every response finished); empty: all finished.
        sample_versions: (S, 2) int64 oldest and newest policy version of each response's segments (a response
            continued after a weight reload spans several); empty: all `policy_version`. For a response assembled
            from segments `policy_version` is the oldest version of any segment (the lag is counted from it).
        padded_slots: row-steps the engine calls spent on these responses (rows x longest new tokens of each call,
            summed per response); -1: one call, ``S * max(lengths)`` (see `padding_rate`).
    """

    task_id: int
    minibatch_id: int
    attempt: int
    gu: int
    actor: int
    policy_version: int
    prompt_ids: list[Any]
    n: int
    lengths: np.ndarray
    stopped: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray
    prompt_tokens: np.ndarray
    texts: list[str]
    gen_start: float
    gen_end: float
    reload_s: float = 0.0
    reload_error: str = ""
    depth_at_arrival: float = float("nan")
    finished: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    sample_versions: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    padded_slots: int = -1

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)

    @property
    def gen_s(self) -> float:
        """Wall-clock seconds of the engine call (of a response set assembled from segments: the engine seconds
        attributed to it)."""
        return self.gen_end - self.gen_start

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def complete(self) -> bool:
        """True unless some response reached the call's token budget unfinished (partial rollouts)."""
        return not self.finished.size or bool(self.finished.all())

    @property
    def split_responses(self) -> int:
        """Responses whose segments came from more than one policy version."""
        v = self.sample_versions
        return int((v[:, 0] != v[:, 1]).sum()) if v.size else 0

    @property
    def padding_rate(self) -> float:
        """Realized padding rate 1 - tokens / row-steps of the engine calls (one call: 1 - mean/max response
        length over all samples); 0 for an empty batch."""
        if self.padded_slots > 0:
            return 1.0 - self.total_tokens / self.padded_slots
        top = int(self.lengths.max(initial=0))
        return 1.0 - float(self.lengths.mean()) / top if top > 0 else 0.0


@dataclass(slots=True)
class SegmentOutput:
    """What one continuation item (`WorkItem.rows`, partial rollouts) generated: the next segment of R responses.

    Attributes:
        cont_id, attempt: the continuation item's id and attempt.
        gu, actor, policy_version: where and with which weights it was generated.
        task_ids, samples: (R,) int64 the rows' task and sample index, in the item's order.
        lengths: (R,) int32 new tokens per row; finished: (R,) bool (EOS or ``max_new_tokens`` reached);
            stopped: (R,) bool (EOS).
        token_ids: (T,) int32 new tokens of all rows concatenated; logprobs: (T,) float32 their behaviour log-probs
            (empty if the engine gave none).
        texts: (R,) the decoded whole response (earlier segments + this one) of each row.
        gen_start, gen_end, reload_s, reload_error: as in `MinibatchOutput`.
    """

    cont_id: int
    attempt: int
    gu: int
    actor: int
    policy_version: int
    task_ids: np.ndarray
    samples: np.ndarray
    lengths: np.ndarray
    finished: np.ndarray
    stopped: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray
    texts: list[str]
    gen_start: float
    gen_end: float
    reload_s: float = 0.0
    reload_error: str = ""

    @property
    def gen_s(self) -> float:
        return self.gen_end - self.gen_start

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum())


@dataclass(slots=True)
class Failure:
    """A minibatch attempt that did not complete (engine error or actor death)."""

    task_id: int
    attempt: int
    gu: int
    actor: int
    reason: str
    continuation: bool = False  # the attempt was a continuation item (`task_id` is its continuation id)


@dataclass(slots=True)
class GUReport:
    """What one `GenerationUnit.collect` call returns: everything finished since the previous call.

    Attributes:
        gu: generation unit index.
        outputs: completed minibatches (and, with partial rollouts, continuation segments).
        failures: attempts that failed (their tasks go back to the Database).
        dead_actors: global indices of actors that died for good (restarts exhausted or reload failed).
        queued: minibatches waiting in the unit's input queue when the report was made.
    """

    gu: int
    outputs: list[MinibatchOutput | SegmentOutput] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    dead_actors: list[int] = field(default_factory=list)
    queued: int = 0


@dataclass(slots=True)
class GlobalBatch:
    """The prompts of one training step with all their samples (B prompts, S = B * n samples, T tokens).

    Attributes:
        step: 1-based trainer step this batch is for.
        prompt_ids: (B,) prompt ids in arrival order.
        task_ids, minibatch_ids, gus, actors, versions: (B,) int64 provenance of each prompt.
        n: samples per prompt; sample s belongs to prompt ``s // n``.
        lengths: (S,) int32 response lengths; stopped: (S,) bool.
        sample_offsets: (S + 1,) int64; sample s's tokens are ``token_ids[sample_offsets[s]:sample_offsets[s+1]]``.
        token_ids: (T,) int32; logprobs: (T,) float32 behaviour log-probs (empty if the engine gave none).
        prompt_tokens: (B,) int32; texts: (S,) decoded responses.
        gen_s, reload_s, depth_at_arrival: (B,) float64, per prompt its minibatch's generation seconds, reload
            seconds before it, and Training Queue depth in global batches just before it arrived (the T_gen,
            T_load and Q_arrival of the lag estimate; empty when built without them).
    """

    step: int
    prompt_ids: list[Any]
    task_ids: np.ndarray
    minibatch_ids: np.ndarray
    gus: np.ndarray
    actors: np.ndarray
    versions: np.ndarray
    n: int
    lengths: np.ndarray
    stopped: np.ndarray
    sample_offsets: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray
    prompt_tokens: np.ndarray
    texts: list[str]
    gen_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    reload_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    depth_at_arrival: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)

    def sample_tokens(self, s: int) -> np.ndarray:
        """Token ids of sample `s`."""
        return self.token_ids[self.sample_offsets[s] : self.sample_offsets[s + 1]]


@dataclass(slots=True)
class StepResult:
    """What the Training Unit returns for one step.

    Attributes:
        step: 1-based trainer step just completed.
        version: policy version after the step.
        duration_s: wall-clock seconds of the step inside the Training Unit.
        metrics: flat metric dict (names namespaced by the trainer), logged with the iteration.
        state: small JSON-able trainer state stored in the runtime checkpoint (`Trainer.restore` reads it).
        weights: snapshot for the generation actors, or None when no new one is exported this step.
    """

    step: int
    version: int
    duration_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    weights: WeightUpdate | None = None
