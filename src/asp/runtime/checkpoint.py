"""Runtime checkpoint: the run's position (Database state, trainer step, policy version, trainer state).

One JSON file, ``<dir>/runtime_state.json``, rewritten atomically (`asp.io.write_json`) every
`checkpoint_interval` steps and at the end. Besides the latest position it keeps the `KEEP_POSITIONS` - 1
positions saved before it (``earlier``, newest first), so that when the trainer checkpoint a position names
turns out damaged, the run resumes from an older position *and* the trainer checkpoint of that same step:
runtime position and weights always come from the same step, never a newer position with older weights.

`load` returns a position only when the file belongs to the same plan (fingerprint) and the run it describes
did not finish; otherwise the run starts fresh and says why. A trainer checkpoint named in a position
(``trainer_state["checkpoint"]``, a directory) is checked first with `checkpoint_problem`: the directory
exists, every file its ``manifest.json`` lists (`write_manifest`) is there with its recorded size, and every
``*.safetensors`` file is whole (header readable, tensor data as long as the header says). A damaged one is
skipped with a warning (falling back to the newest intact position); when none is intact, `UserError`.
Bit flips inside tensor data that keep the sizes are not detected (no hashing of multi-GB files).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asp.errors import UserError

log = logging.getLogger(__name__)
FILENAME = "runtime_state.json"
FORMAT = 1
KEEP_POSITIONS = 5  # the latest + 4 earlier; the trainer keeps runtime.grpo.keep_checkpoints (>= 2) of its own
MANIFEST = "manifest.json"
_warned: set[tuple[str, int]] = set()  # (file, step) fallbacks already reported in this process


# ---- trainer checkpoint directories -------------------------------------------------------------------
def write_manifest(directory: Path) -> None:
    """Record every file in `directory` with its size in bytes (``manifest.json``); call it after the last file."""
    directory = Path(directory)
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST}
    (directory / MANIFEST).write_text(json.dumps({"files": files}, indent=1, sort_keys=True))


def checkpoint_problem(directory: Path) -> str | None:
    """Why the checkpoint `directory` cannot be loaded (one sentence naming the file), or None if it looks intact."""
    directory = Path(directory)
    if not directory.is_dir():
        return f"{directory} is missing"
    manifest = directory / MANIFEST
    if manifest.is_file():
        try:
            files = dict(json.loads(manifest.read_text())["files"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"{manifest} cannot be read ({exc})"
        for name, size in files.items():
            path = directory / name
            if not path.is_file():
                return f"{path} is missing"
            if path.stat().st_size != int(size):
                return f"{path} is {path.stat().st_size:,} bytes, {MANIFEST} records {int(size):,} (truncated?)"
    for path in sorted(directory.glob("*.safetensors")):
        problem = _safetensors_problem(path)
        if problem:
            return f"{path} {problem}"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """Structural check of a safetensors file without loading it: 8-byte header size, JSON header, data length."""
    size = path.stat().st_size
    if size < 8:
        return f"is {size} bytes, too short for a safetensors file"
    with path.open("rb") as fh:
        header_len = int.from_bytes(fh.read(8), "little")
        if 8 + header_len > size:
            return f"is {size:,} bytes but its header alone claims {header_len:,} (truncated?)"
        try:
            header = json.loads(fh.read(header_len))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            return f"has an unreadable header ({type(exc).__name__}: {exc})"
    data = size - 8 - header_len
    if data != end:
        return f"holds {data:,} bytes of tensor data but its header describes {end:,} (truncated?)"
    return None


def trainer_state_problem(trainer_state: dict[str, Any]) -> str | None:
    """`checkpoint_problem` of the trainer checkpoint a position names (None when it names none)."""
    path = trainer_state.get("checkpoint") if isinstance(trainer_state, dict) else None
    return checkpoint_problem(Path(path)) if path else None


# ---- the runtime position -----------------------------------------------------------------------------
@dataclass(slots=True)
class Checkpointer:
    """Reads and writes ``<directory>/runtime_state.json`` for the plan with `fingerprint`.

    `positions` is the chain of positions this run saved or resumed from, newest first (at most
    `KEEP_POSITIONS`); `save` writes the newest with the earlier ones after it.
    """

    directory: Path
    fingerprint: str
    positions: list[dict[str, Any]] = field(default_factory=list)

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

        position = {
            "trainer_step": trainer_step,
            "policy_version": policy_version,
            "trainer_state": trainer_state,
            "database": database,
        }
        # positions at or after this step belong to an abandoned attempt (a resume from an older position)
        older = [p for p in self.positions if int(p["trainer_step"]) < trainer_step]
        self.positions = [position, *older][:KEEP_POSITIONS]
        write_json(
            {
                "format": FORMAT,
                "fingerprint": self.fingerprint,
                **position,
                "finished": finished,
                "earlier": self.positions[1:],
            },
            self.path,
        )

    def load(self) -> tuple[dict[str, Any] | None, str]:
        """(state, reason): state is None when there is nothing to resume; reason says why (or 'resumed').
        The caller reports the reason (a checkpoint of a different plan / trainer setup is not an error).

        The state is the newest saved position whose trainer checkpoint is intact; when that is not the latest
        one, a warning names the damaged file and the reason reads ``resumed from step k (...)``.

        Raises:
            UserError: the file cannot be read, or no position's trainer checkpoint is intact.
        """
        if not self.path.exists():
            return None, "no checkpoint"
        try:
            state = json.loads(self.path.read_text())
            ok = state["format"] == FORMAT and isinstance(state["database"], dict)
            earlier = list(state.get("earlier", []))
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
        latest = {k: state[k] for k in ("trainer_step", "policy_version", "trainer_state", "database")}
        return self._newest_intact([latest, *earlier], state)

    def load_finished(self) -> dict[str, Any] | None:
        """The saved position when it is the finished end of a run of this plan (else None; never raises)."""
        try:
            state = json.loads(self.path.read_text())
            if state["format"] == FORMAT and state["fingerprint"] == self.fingerprint and state["finished"]:
                return {k: state[k] for k in ("trainer_step", "policy_version", "trainer_state", "database")}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def _newest_intact(self, candidates: list[dict[str, Any]], state: dict[str, Any]) -> tuple[dict[str, Any], str]:
        problems: list[str] = []
        for index, position in enumerate(candidates):
            problem = trainer_state_problem(position["trainer_state"])
            if problem:
                problems.append(f"step {position['trainer_step']}: {problem}")
                continue
            self.positions = candidates[index:KEEP_POSITIONS]
            resumed = {"format": FORMAT, "fingerprint": self.fingerprint, "finished": False, **position}
            if not index:
                return resumed, "resumed"
            return resumed, self._fallback(int(state["trainer_step"]), int(position["trainer_step"]), problems)
        raise UserError(
            f"runtime checkpoint {self.path}: none of the trainer checkpoints it names is intact ("
            + "; ".join(problems)
            + f"). Restore them from a backup, or delete {self.directory} to start the run afresh."
        )

    def _fallback(self, latest: int, step: int, problems: list[str]) -> str:
        """Warn (once per process) that the run resumes from `step` instead of `latest`; return the reason."""
        damaged = "; ".join(problems)
        again = f"step {latest}" if latest == step + 1 else f"steps {step + 1}-{latest}"
        if (str(self.path), latest) not in _warned:
            _warned.add((str(self.path), latest))
            log.warning(
                "%s: the trainer checkpoint of the latest position (step %d) is damaged (%s). Resuming from step %d, "
                "the newest position whose trainer checkpoint is intact: the runtime position and the weights both "
                "come from step %d; %s are trained again (a tracker that logged them already gets them twice).",
                self.path,
                latest,
                damaged,
                step,
                step,
                again,
            )
        return f"resumed from step {step}: the trainer checkpoint of step {latest} is damaged ({damaged})"
