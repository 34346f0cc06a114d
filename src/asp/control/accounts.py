"""`RunAccounts`: the Control Unit's book-keeping of the whole run across sessions, owned by `ControlCore`.

A checkpointed runtime run may take several sessions (a crash or a stop, then a resume). Its summary, iteration list
and minibatch records cover the whole run, not only the last session: a resumed session starts from what the run
log (`asp.runtime.runlog`) says about its position, and `RunAccounts.resume` takes that in (the earlier sessions'
steps, minibatch records, queue-depth trace and cumulative counters). From then on the core stamps this session's
times in *run time* (seconds over the run's sessions, this one starting where the resumed position ended) and the
accounts add the earlier sessions to every whole-run counter (`total`), the records (`all_records`), the steps
(`all_iterations`) and the queue trace (`all_trace`). `take_segment` hands out what was recorded since the previous
segment (the run log appends it before each position is saved).

The accounts also keep the counters the per-iteration metrics read over the whole run: prompts per Generation Unit
and per actor (`count_prompts`) and the policy lag of every trained prompt (`count_lags`).

Only the core writes them (its driver calls `ControlCore.resume` and `ControlCore.take_segment`). Pure Python and
numpy; tests: tests/control/test_accounts.py, tests/runtime/test_runtime.py (Ctrl-C + resume),
tests/runtime/test_runlog.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any

import numpy as np


@dataclass
class RunAccounts:
    """The whole run's book-keeping (see the module docstring).

    Args:
        actor_ids: the run's actors (listed in `by_actor` from the start).

    Attributes:
        session: sessions of this run before this one.
        base: run time (seconds) at the position this session resumed from.
        earlier_totals: the run's cumulative counters at that position (``prompts_trained``, ``wall_s``, ...).
        earlier_records: the earlier sessions' minibatch records (run time).
        earlier_iterations: the earlier sessions' steps, ``{"step": k, **metrics}``.
        earlier_trace: the earlier sessions' ``(run time, depth in prompts)`` of the Training Queue.
        by_gu: prompts received per Generation Unit index, over the whole run.
        by_actor: prompts received per actor id, over the whole run (every known actor listed, 0 when none).
        lag_sum, lag_count, lag_max: the policy lag over this session's trained prompts (`lag_max`: the whole run).
        flushed: this session's records and queue-trace entries already handed out by `take_segment`.
    """

    actor_ids: InitVar[Iterable[int]] = ()
    session: int = 0
    base: float = 0.0
    earlier_totals: dict[str, float] = field(default_factory=dict)
    earlier_records: list[dict[str, Any]] = field(default_factory=list)
    earlier_iterations: list[dict[str, Any]] = field(default_factory=list)
    earlier_trace: list[tuple[float, float]] = field(default_factory=list)
    by_gu: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    by_actor: dict[int, int] = field(default_factory=dict)
    lag_sum: float = 0.0
    lag_count: int = 0
    lag_max: float = float("nan")
    flushed: tuple[int, int] = (0, 0)

    def __post_init__(self, actor_ids: Iterable[int]) -> None:
        for actor in actor_ids:
            self.by_actor.setdefault(actor, 0)

    def resume(
        self,
        totals: Mapping[str, float],
        records: list[dict[str, Any]],
        iterations: list[dict[str, Any]],
        trace: list[tuple[float, float]],
    ) -> None:
        """Continue the run whose earlier sessions are described by the run log at the restored position: its
        cumulative `totals` (``sessions``, ``wall_s``, ``lag_max`` and the counters of `ControlCore.totals`), its
        minibatch `records` (each with ``gu``, ``actor`` and ``prompts``), its steps and its queue-depth `trace`
        (extended here by the empty queue this session starts with)."""
        self.session = int(totals.get("sessions", 0))
        self.base = float(totals.get("wall_s", 0.0))
        self.earlier_totals = dict(totals)
        self.earlier_records, self.earlier_iterations = records, iterations
        self.earlier_trace = trace
        if trace:
            trace.append((self.base, 0.0))  # the queue is empty when the session starts
        for record in records:
            self.count_prompts(int(record["gu"]), int(record["actor"]), int(record["prompts"]))
        self.lag_max = float(totals.get("lag_max", float("nan")))

    def count_prompts(self, gu: int, actor: int, prompts: int) -> None:
        """`prompts` more received from `actor` of Generation Unit `gu`."""
        self.by_gu[gu] += prompts
        self.by_actor[actor] = self.by_actor.get(actor, 0) + prompts

    def count_lags(self, lags: np.ndarray) -> None:
        """The policy lags of a trained step's prompts."""
        if lags.size:
            self.lag_sum += float(lags.sum())
            self.lag_count += int(lags.size)
            self.lag_max = float(np.nanmax([self.lag_max, float(lags.max())]))

    def total(self, name: str, session_value: float) -> float:
        """A counter over the whole run: the earlier sessions' (at the resumed position) plus this session's."""
        return float(self.earlier_totals.get(name, 0.0)) + float(session_value)

    def all_records(self, session: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The whole run's minibatch records: the earlier sessions' and this `session`'s."""
        return self.earlier_records + session

    def all_iterations(self, session: list[dict[str, float]]) -> list[dict[str, Any]]:
        """The whole run's steps: the earlier sessions' and this `session`'s."""
        return self.earlier_iterations + session

    def all_trace(self, session: list[tuple[float, float]]) -> list[tuple[float, float]]:
        """The whole run's queue-depth trace: the earlier sessions' and this `session`'s (in run time)."""
        return self.earlier_trace + session

    def take_segment(self, records: list[dict[str, Any]], trace: list[Any]) -> tuple[list[dict[str, Any]], list[Any]]:
        """This session's `records` and `trace` entries not handed out yet (the run log's next segment); they count
        as handed out from now on."""
        start_records, start_trace = self.flushed
        self.flushed = (len(records), len(trace))
        return records[start_records:], trace[start_trace:]
