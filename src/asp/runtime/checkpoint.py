"""Runtime checkpoint: the run's position (Database state, trainer step, policy version, trainer state).

One JSON file, ``<dir>/runtime_state.json``, rewritten atomically (`asp.io.write_json`) every
`checkpoint_interval` steps and at the end. `load` returns it only when it belongs to the same plan
(fingerprint) and the run it describes did not finish; otherwise the run starts fresh and says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asp.errors import UserError

FILENAME = "runtime_state.json"
FORMAT = 1


@dataclass(slots=True)
class Checkpointer:
    """Reads and writes ``<directory>/runtime_state.json`` for the plan with `fingerprint`."""

    directory: Path
    fingerprint: str

    @property
    def path(self) -> Path:
        return Path(self.directory) / FILENAME

    def save(
        self,
        *,
        database: dict[str, Any],
        trainer_step: int,
        policy_version: int,
        trainer_state: dict[str, Any],
        finished: bool,
    ) -> None:
        from asp.io import write_json  # imports pandas: keep it out of the actor processes

        write_json(
            {
                "format": FORMAT,
                "fingerprint": self.fingerprint,
                "trainer_step": trainer_step,
                "policy_version": policy_version,
                "trainer_state": trainer_state,
                "database": database,
                "finished": finished,
            },
            self.path,
        )

    def load(self) -> tuple[dict[str, Any] | None, str]:
        """(state, reason): state is None when there is nothing to resume; reason says why (or 'resumed').
        The caller reports the reason (a checkpoint of a different plan / trainer setup is not an error)."""
        if not self.path.exists():
            return None, "no checkpoint"
        try:
            state = json.loads(self.path.read_text())
            ok = state["format"] == FORMAT and isinstance(state["database"], dict)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(
                f"runtime checkpoint {self.path} cannot be read ({exc}); delete it to start the run afresh."
            ) from exc
        if not ok:
            raise UserError(f"runtime checkpoint {self.path} has an unknown format; delete it to start afresh.")
        if state["fingerprint"] != self.fingerprint:
            return None, "checkpoint of a different plan"
        if state["finished"]:
            return None, "previous run finished"
        return state, "resumed"
