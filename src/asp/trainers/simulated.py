"""`SimulatedTrainer`: the fixed-duration stand-in Training Unit (paper appendix F.6.3) for scheduling studies.

It sleeps a fixed step time, bumps the version, and announces a snapshot whose reload the generation actors
model as a fixed delay; optionally it appends a ledger line per step (what reached the trainer, exactly once).
Build it through `asp.trainers.make_trainer_factory("simulated", config)`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asp.control.messages import GlobalBatch, StepResult, WeightUpdate
from asp.trainers.ledger import append_ledger, ledger_record


class SimulatedTrainer:
    """Fixed-duration stand-in trainer.

    Args:
        step_time_s: seconds each step sleeps (``runtime.trainer.step_s``; no defaults here: the params').
        refresh_delay_s: reload delay announced with every snapshot (paid by each actor, deferred;
            ``runtime.trainer.refresh_delay_s``).
        ledger_path: if set, one JSON line per step is appended there (step, prompt_ids, task_ids, versions,
            lengths, token and log-prob counts): the record of exactly what reached the trainer.
    """

    def __init__(self, step_time_s: float, refresh_delay_s: float, ledger_path: str | None = None):
        self.step_time_s, self.refresh_delay_s = step_time_s, refresh_delay_s
        self.ledger = Path(ledger_path) if ledger_path else None
        self.version = 0

    def step(self, batch: GlobalBatch) -> StepResult:
        start = time.perf_counter()
        if self.step_time_s > 0:
            time.sleep(self.step_time_s)
        self.version += 1
        if self.ledger is not None:
            logprob_max = float(batch.logprobs.max()) if batch.logprobs.size else None
            append_ledger(self.ledger, {**ledger_record(batch, self.version), "logprob_max": logprob_max})
        lengths = batch.lengths
        return StepResult(
            step=batch.step,
            version=self.version,
            duration_s=time.perf_counter() - start,
            metrics={
                "train/prompts": float(batch.num_prompts),
                "train/mean_response_length": float(lengths.mean()) if lengths.size else 0.0,
            },
            state={"version": self.version},
            weights=WeightUpdate(self.version, None, self.refresh_delay_s),
        )

    def restore(self, state: Mapping[str, Any]) -> WeightUpdate | None:
        self.version = int(state.get("version", 0))
        return WeightUpdate(self.version, None, self.refresh_delay_s) if self.version else None
