"""`WorkPlan`: the schedule as the runtime consumes it (minibatches of prompt ids in dispatch order + groups).

Build it from the scheduler's `Schedule` (`WorkPlan.from_schedule`), from the schedule Parquet frame
(`WorkPlan.from_frame`, one row per prompt: prompt_id, minibatch_id, group_id, dispatch_rank), or directly
from lists. `check_prompts` verifies every scheduled prompt has a text before anything starts, and
`fingerprint` identifies a plan in checkpoints.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from asp.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

    from asp.schedule import Schedule


def _plain(value: Any) -> Any:
    """numpy scalars -> Python scalars (JSON-able, compact to pickle)."""
    return value.item() if isinstance(value, np.generic) else value


@dataclass(frozen=True, slots=True)
class WorkPlan:
    """Minibatches in dispatch order.

    Attributes:
        minibatches: N_B lists of prompt ids; the p-th is dispatched p-th.
        minibatch_ids: (N_B,) the scheduler's id of each minibatch.
        group_ids: (N_B,) batch group of each minibatch, non-decreasing; a group is one dispatch unit.
        predicted: prompt id -> the schedule's expected length (tokens): its loads (calibrated predictions, or raw
            ones without a calibration map; a frame's ``load_used``, else ``predicted_length``), when known. Partial
            rollouts' online length correction reads it; not part of the plan's identity (equality, hash,
            `fingerprint`).
    """

    minibatches: tuple[tuple[Any, ...], ...]
    minibatch_ids: tuple[int, ...]
    group_ids: tuple[int, ...]
    predicted: Mapping[Any, float] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        n = len(self.minibatches)
        if n == 0:
            raise UserError("the schedule has no minibatches; run the schedule stage on a non-empty prompt set.")
        if len(self.minibatch_ids) != n or len(self.group_ids) != n:
            raise UserError(
                f"schedule has {n} minibatches but {len(self.minibatch_ids)} minibatch ids and "
                f"{len(self.group_ids)} group ids; they must match one to one."
            )
        empty = [p for p, mb in enumerate(self.minibatches) if len(mb) == 0]
        if empty:
            raise UserError(f"schedule minibatch at dispatch rank {empty[0]} is empty; rebuild the schedule.")
        if any(b < a for a, b in zip(self.group_ids, self.group_ids[1:], strict=False)):
            raise UserError("schedule group ids must be non-decreasing in dispatch order; rebuild the schedule.")
        ids = [pid for mb in self.minibatches for pid in mb]
        if len(set(ids)) != len(ids):
            dup = next(pid for pid, count in Counter(ids).items() if count > 1)
            raise UserError(
                f"prompt id {dup!r} appears more than once in the schedule; each prompt is scheduled once."
            )

    @classmethod
    def from_lists(
        cls,
        minibatches: Sequence[Iterable[Any]],
        group_ids: Sequence[int] | None = None,
        minibatch_ids: Sequence[int] | None = None,
        predicted: Mapping[Any, float] | None = None,
    ) -> WorkPlan:
        """From prompt-id lists in dispatch order; groups default to one per minibatch, ids to the rank; `predicted`:
        the loads it was balanced on (prompt id -> tokens), when known."""
        n = len(minibatches)
        return cls(
            tuple(tuple(_plain(p) for p in mb) for mb in minibatches),
            tuple(int(i) for i in (range(n) if minibatch_ids is None else minibatch_ids)),
            tuple(int(g) for g in (range(n) if group_ids is None else group_ids)),
            {_plain(p): float(x) for p, x in (predicted or {}).items()},
        )

    @classmethod
    def from_schedule(cls, schedule: Schedule) -> WorkPlan:
        """From an `asp.schedule.Schedule` (group of the p-th minibatch = p // k; `predicted` = its loads)."""
        mbs = schedule.minibatches()
        plan = cls.from_lists(mbs, [p // schedule.k for p in range(len(mbs))], list(schedule.minibatch_ids))
        loads = getattr(schedule, "loads", None)
        if loads is None or len(loads) != len(schedule.prompt_ids):
            return plan
        predicted = {_plain(p): float(x) for p, x in zip(schedule.prompt_ids, loads, strict=True)}
        return cls(plan.minibatches, plan.minibatch_ids, plan.group_ids, predicted)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> WorkPlan:
        """From the schedule Parquet layout (one row per prompt; rows of a minibatch keep their order)."""
        missing = [c for c in ("prompt_id", "minibatch_id", "group_id", "dispatch_rank") if c not in frame.columns]
        if missing:
            raise UserError(
                f"schedule table lacks column(s) {missing}; it needs prompt_id, minibatch_id, "
                "group_id and dispatch_rank (the schedule stage's output)."
            )
        df = frame.sort_values("dispatch_rank", kind="stable")
        mbs, mb_ids, groups = [], [], []
        for _, rows in df.groupby("dispatch_rank", sort=True):
            if rows["minibatch_id"].nunique() != 1 or rows["group_id"].nunique() != 1:
                raise UserError(
                    f"schedule dispatch_rank {rows['dispatch_rank'].iloc[0]} mixes minibatch or group ids."
                )
            mbs.append(rows["prompt_id"].tolist())
            mb_ids.append(int(rows["minibatch_id"].iloc[0]))
            groups.append(int(rows["group_id"].iloc[0]))
        plan = cls.from_lists(mbs, groups, mb_ids)
        column = next((c for c in ("load_used", "predicted_length") if c in df.columns), None)
        if column is None:
            return plan
        predicted = {_plain(p): float(x) for p, x in zip(df["prompt_id"], df[column], strict=True)}
        return cls(plan.minibatches, plan.minibatch_ids, plan.group_ids, predicted)

    @property
    def n_minibatches(self) -> int:
        return len(self.minibatches)

    @property
    def n_prompts(self) -> int:
        return sum(len(mb) for mb in self.minibatches)

    def prompt_ids(self) -> list[Any]:
        """All prompt ids in dispatch order."""
        return [pid for mb in self.minibatches for pid in mb]

    def fingerprint(self, **extra: Any) -> str:
        """sha256 over the dispatch order, groups and any `extra` settings (identifies a checkpoint's plan)."""
        payload = json.dumps(
            [[list(mb) for mb in self.minibatches], list(self.minibatch_ids), list(self.group_ids), extra],
            default=str,
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()


def as_plan(schedule: Any) -> WorkPlan:
    """Accept a WorkPlan, an `asp.schedule.Schedule`, a schedule DataFrame or a list of prompt-id lists."""
    import pandas as pd

    if isinstance(schedule, WorkPlan):
        return schedule
    if isinstance(schedule, pd.DataFrame):
        return WorkPlan.from_frame(schedule)
    if hasattr(schedule, "minibatches") and hasattr(schedule, "k"):
        return WorkPlan.from_schedule(schedule)
    if isinstance(schedule, Sequence):
        return WorkPlan.from_lists(schedule)
    raise UserError(f"cannot read a schedule from a {type(schedule).__name__}; pass a Schedule, frame or lists.")


def check_prompts(plan: WorkPlan, prompts_by_id: Mapping[Any, str]) -> None:
    """Every scheduled prompt must have a non-empty text.

    Raises:
        UserError: naming how many and which prompt ids are missing, and what to do.
    """
    missing = [pid for pid in plan.prompt_ids() if pid not in prompts_by_id]
    if missing:
        raise UserError(
            f"{len(missing)} of {plan.n_prompts} scheduled prompts are not in the prompt set, e.g. {missing[:5]}; "
            "the schedule was built for different prompts. Re-run the schedule stage on the current prompts."
        )
    bad = [pid for pid in plan.prompt_ids() if not isinstance(prompts_by_id[pid], str) or not prompts_by_id[pid]]
    if bad:
        raise UserError(f"prompt(s) {bad[:5]} have an empty or non-text prompt; fix the prompt set.")
