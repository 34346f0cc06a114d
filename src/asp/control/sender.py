"""The Generation Sender's policy and the policy-lag bound (paper appendix B.2, B.4), as pure functions.

The Control Unit core `asp.control.core.ControlCore` calls these; the Ray runtime and the simulator `asp.sim` both
drive that core, so the two cannot disagree about what is sent where or what is evicted:

* `plan_dispatch` fills each live Generation Unit up to its target of outstanding minibatches (its input
  queue target plus one per live actor), handing out whole dispatch units from the Database (a failed task
  alone, else the rest of the head batch group) to the GU furthest below its target.
* `plan_round` / `round_complete` are the synchronous mode's sender (``runtime.mode: sync``): a round issues
  single minibatches in dispatch order, spread over the GUs by live actors, until it holds one global batch of
  prompts; the trainer takes the round once every task of it came back.
* `enforce_lag_bound` removes queued minibatches generated more than `max_policy_lag` versions ago from the
  Training Queue and tells the Database: dropped prompts count as consumed (never trained), regenerated ones
  are sent again with newer weights.

No Ray, no clock: time is an argument. Tests: tests/runtime/test_sender.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from asp.control.database import Database
from asp.control.messages import WorkItem
from asp.control.queue import TrainingQueue


@dataclass(slots=True)
class GULoad:
    """The sender's view of one live Generation Unit.

    Attributes:
        index: GU index (the Database records which GU a task was issued to).
        outstanding: minibatches sent to it and not yet reported back.
        target: how many it should have outstanding (`gu_queue_target` + live actors).
    """

    index: int
    outstanding: int
    target: int


def plan_dispatch(db: Database, gus: list[GULoad]) -> dict[int, list[WorkItem]]:
    """Issue dispatch units until every GU is at its target or the Database has nothing left to issue.

    Args:
        db: the Database (its tasks are marked issued).
        gus: the live GUs; their `outstanding` counts are increased by what is sent.

    Returns:
        GU index -> work items to submit to it, in order (GUs with nothing new are absent).
    """
    sent: dict[int, list[WorkItem]] = {}
    while gus:
        g = min(gus, key=lambda x: x.outstanding - x.target)
        if g.outstanding >= g.target:
            break
        items = db.next_unit(g.index)
        if not items:
            break
        sent.setdefault(g.index, []).extend(items)
        g.outstanding += len(items)
    return sent


def plan_round(db: Database, gus: list[GULoad], want: int) -> tuple[dict[int, list[WorkItem]], int]:
    """Synchronous mode: re-issue every failed task, then issue new tasks one at a time until `want` prompts.

    Retries belong to the round that first issued them, so they are sent whatever `want` is and do not count.
    Each item goes to the GU furthest below its target (set the target to the GU's live actors to spread a
    round so that every actor decodes).

    Args:
        db: the Database (its tasks are marked issued).
        gus: the live GUs; their `outstanding` counts are increased by what is sent.
        want: prompts the round still needs (<= 0: retries only).

    Returns:
        (GU index -> work items to submit to it in order, new prompts issued).
    """
    sent: dict[int, list[WorkItem]] = {}
    issued = 0
    while gus:
        g = min(gus, key=lambda x: x.outstanding - x.target)
        item = db.next_retry(g.index)
        if item is None and issued < want:
            item = db.next_task(g.index)
            issued += len(item.prompt_ids) if item is not None else 0
        if item is None:
            break
        sent.setdefault(g.index, []).append(item)
        g.outstanding += 1
    return sent, issued


def round_complete(db: Database, issued: int, want: int) -> bool:
    """Synchronous mode: True when the round (`issued` new prompts of `want`) may be trained.

    That is when nothing is out or waiting for a retry and the round holds `want` prompts or no new task is left.
    """
    return db.n_issued == 0 and not db.retry and (issued >= want or not db.has_new_work)


def enforce_lag_bound(
    tq: TrainingQueue,
    db: Database,
    version: int,
    bound: int | None,
    stale_samples: Literal["drop", "regenerate"],
    now: float,
) -> tuple[int, int]:
    """Evict queued minibatches older than `version - bound` before the next batch is cut.

    Args:
        tq: the Training Queue.
        db: the Database (dropped prompts are marked consumed; regenerated tasks are re-queued first).
        version: the trainer's current policy version (fixed until the next step ends).
        bound: `max_policy_lag`; None disables the bound.
        stale_samples: "drop" or "regenerate".
        now: time of the eviction (for the queue's depth trace).

    Returns:
        (prompts dropped, prompts sent for regeneration).
    """
    if bound is None:
        return 0, 0
    dropped = regenerated = 0
    for task_id, count in tq.evict_older(version - bound, now):
        if stale_samples == "regenerate":
            db.regenerate(task_id)
            regenerated += count
        else:
            db.mark_consumed(task_id, count)
            dropped += count
    return dropped, regenerated
