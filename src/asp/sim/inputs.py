"""Inputs and output of the simulator (`asp.sim.engine.simulate`): the realized lengths of the scheduled prompts
(`Workload`), where the actors run (`Resources`) and what a simulation returns (`SimResult`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asp.sim.sharing import ContentionTable, sharing_rate

MAX_DRAWN_VISITS = 32  # visits drawn per prompt at most (`visits_needed`): a run of more passes cycles through them


def visits_needed(steps: int | None, batch_prompts: int, prompts: int) -> int:
    """How many visits of each of `prompts` prompts to draw for a run of `steps` trainer steps of `batch_prompts`
    prompts (`Workload.revisits`): its passes over the prompts, and two more for what is in flight and generated
    again, at most `MAX_DRAWN_VISITS`; 1 without steps or prompts."""
    if not steps or prompts <= 0:
        return 1
    return min(math.ceil(steps * batch_prompts / prompts) + 2, MAX_DRAWN_VISITS)


@dataclass(frozen=True)
class Workload:
    """What the policy generates for each scheduled prompt.

    Attributes:
        index: prompt id -> row of `lengths` / `prompt_tokens`.
        lengths: (P, n) int response lengths of the n samples of each prompt (tokens): its first visit.
        prompt_tokens: (P,) int prompt lengths (tokens).
        max_new_tokens: the response cap (samples at it count as truncated).
        revisits: (V, P, n) int lengths of the later visits of each prompt (a run of several passes over the prompts,
            or a task generated again): visit v >= 1 is ``revisits[(v - 1) % V]``. Empty (V = 0): every visit
            generates `lengths` again, which hands a history-aware pass (``runtime.history``) the exact lengths it
            will meet, where a policy samples a prompt afresh.
    """

    index: Mapping[Any, int]
    lengths: np.ndarray
    prompt_tokens: np.ndarray
    max_new_tokens: int
    revisits: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), np.int32))

    @classmethod
    def from_arrays(
        cls,
        prompt_ids: Sequence[Any],
        lengths: np.ndarray,
        prompt_tokens: np.ndarray,
        max_new_tokens: int,
        revisits: np.ndarray | None = None,
    ) -> Workload:
        """A workload of `prompt_ids` (see the attributes); `revisits` None: no later visits of their own."""
        ids = list(prompt_ids)
        lengths, prompt_tokens = np.asarray(lengths), np.asarray(prompt_tokens)
        if lengths.ndim != 2 or lengths.shape[0] != len(ids) or np.shape(prompt_tokens) != (len(ids),):
            raise ValueError(
                f"workload needs lengths (P, n) and prompt_tokens (P,) for {len(ids)} prompts, got "
                f"{lengths.shape} and {np.shape(prompt_tokens)}"
            )
        later = np.zeros((0, *lengths.shape), np.int32) if revisits is None else np.asarray(revisits)
        if later.ndim != 3 or later.shape[1:] != lengths.shape:
            raise ValueError(f"workload revisits must be (V, P, n) with (P, n) = {lengths.shape}, got {later.shape}")
        if (lengths.size and (lengths.min() < 0 or prompt_tokens.min() < 0)) or (later.size and later.min() < 0):
            raise ValueError("workload lengths and prompt tokens must be >= 0")
        return cls(
            {p: i for i, p in enumerate(ids)},
            np.asarray(lengths, np.int32),
            np.asarray(prompt_tokens),
            max_new_tokens,
            np.asarray(later, np.int32),
        )

    def visit_lengths(self, rows: Sequence[int], visits: Sequence[int]) -> np.ndarray:
        """(k, n) lengths of the prompts at `rows`, each at its own visit (0 = the first; see `revisits`)."""
        rows_a, visits_a = np.asarray(rows, np.int64), np.asarray(visits, np.int64)
        out = self.lengths[rows_a]
        if len(self.revisits):
            later = visits_a > 0
            out[later] = self.revisits[(visits_a[later] - 1) % len(self.revisits), rows_a[later]]
        return out


@dataclass(frozen=True)
class Resources:
    """Where the actors run.

    Attributes:
        cores: CPU cores the generation actors share (processor sharing); None = one device each (GPUs).
        threads_per_actor: threads each actor decodes with (its demand on the shared cores).
        report_latency_s: seconds from an actor finishing to the Control Unit ingesting the minibatch.
        trainer_threads: the trainer's demand on the same `cores` while a step runs (`asp.sim.sharing`); None or
            0: the trainer has its own device and its steps take their modelled time whatever the actors do.
        contention: measured slowdowns on the shared `cores` instead of processor sharing by thread demand
            (`asp.sim.sharing.ContentionTable`); then the trainer shares the cores whenever `trainer_threads` is
            not None (its value unused) and the threads are unused.
    """

    cores: float | None = None
    threads_per_actor: int = 1
    report_latency_s: float = 0.0
    trainer_threads: float | None = None
    contention: ContentionTable | None = None

    @property
    def trainer_shares(self) -> bool:
        """Whether a trainer step is one of the sharers of `cores` (shared cores and a positive demand, or a
        trainer beside a contention table)."""
        if self.cores is None:
            return False
        if self.contention is not None:
            return self.trainer_threads is not None
        return bool(self.trainer_threads)

    def rates(self, decoding: int, training: bool) -> tuple[float, float]:
        """(a decoding actor's rate, the trainer step's rate) of full speed with `decoding` actors decoding and a
        step in flight or not (`training`), on the shared cores."""
        if self.cores is None:
            return 1.0, 1.0
        if self.contention is not None:
            call, step = self.contention.slowdowns(np.asarray(decoding), np.asarray(training))
            return 1.0 / float(call), 1.0 / float(step)
        demand = decoding * self.threads_per_actor + ((self.trainer_threads or 0.0) if training else 0.0)
        rate = float(sharing_rate(np.asarray(demand), self.cores))
        return rate, rate

    def __post_init__(self) -> None:
        if self.cores is not None and not self.cores > 0:
            raise ValueError(f"resources.cores must be > 0 or None, got {self.cores}")
        if self.threads_per_actor < 1 or not self.report_latency_s >= 0:
            raise ValueError("resources.threads_per_actor must be >= 1 and report_latency_s >= 0")
        if self.trainer_threads is not None and not (
            self.trainer_threads >= 0 and math.isfinite(self.trainer_threads)
        ):
            raise ValueError(f"resources.trainer_threads must be finite and >= 0, got {self.trainer_threads}")


@dataclass(slots=True)
class SimResult:
    """What `simulate` returns (metric names as a real run's, plus ``sim/...``).

    Attributes:
        metrics: ``runtime/summary/...`` (Table 4(b) columns), ``sim/...`` (lag, d_off, duty cycle,
            utilizations, events).
        iterations: per-step metric dicts with their ``step``.
        minibatches: one record per ingested minibatch.
        events: processed simulation events.
        decisions: the Control Unit core's event log (`asp.control.core.ControlCore.events`: send, recv, train,
            trained, pause, resume, ...) when `simulate` was asked to record it, else empty.
    """

    metrics: dict[str, float]
    iterations: list[dict[str, float]]
    minibatches: list[dict[str, Any]]
    events: int
    decisions: list[tuple[float, str, int, int, int, int]] = field(default_factory=list)
