"""The trainer ledger: one JSON line per step of exactly what reached a Training Unit (a test hook; the runtime's
exactly-once and ordering tests read it back).

    append_ledger(path, {**ledger_record(batch, step), "token_ids": batch.token_ids.tolist()})

`ledger_record` holds what every trainer records (step, prompt ids, task ids, policy versions, lengths, token and
log-prob counts); a trainer adds its own fields. `SimulatedTrainer` writes it when built with a ledger path, the GRPO
trainer when ``ASP_TRAINER_LEDGER`` is set (`asp.runtime.testhooks`). Tests: tests/runtime/test_runtime.py,
tests/trainers/test_grpo.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asp.control.messages import GlobalBatch


def ledger_record(batch: GlobalBatch, step: int) -> dict[str, Any]:
    """The ledger fields every trainer writes for `batch`, trained as step `step`."""
    return {
        "step": step,
        "prompt_ids": list(batch.prompt_ids),
        "task_ids": batch.task_ids.tolist(),
        "versions": batch.versions.tolist(),
        "lengths": batch.lengths.tolist(),
        "tokens": int(batch.token_ids.size),
        "logprobs": int(batch.logprobs.size),
    }


def append_ledger(path: str | Path, record: dict[str, Any]) -> None:
    """Append `record` to the ledger at `path` as one JSON line."""
    with Path(path).open("a") as fh:
        fh.write(json.dumps(record, default=str) + "\n")
