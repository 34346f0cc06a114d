"""The Control Unit's Database (paper appendix B.2): scheduled minibatches and their state, in schedule order.

Each unit of work is a *task*: one scheduled minibatch in one pass (epoch) over the schedule, with id
``epoch * n_minibatches + dispatch_rank``. States::

    pending --issue--> issued --complete--> done          (first completion wins; later ones are duplicates)
                         |
                         +--fail--> failed --(next_unit re-issues, attempt + 1)--> issued
                                      `--(max_attempts used)--> given up: the run stops with the last error

`next_unit` hands out dispatch units: a failed task alone (retries first), else the rest of the head
batch group; the synchronous mode takes retries (`next_retry`) and single tasks (`next_task`) instead.
Trained prompts are counted per task (`mark_consumed`); the checkpoint `state()` keeps only those counts, so
on `restore` every task that was not fully trained is pending again with its trained prompts cut off: nothing
is trained twice or lost across a restart. Pure Python, no Ray.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from asp.runtime.messages import WorkItem
from asp.runtime.plan import WorkPlan


class TaskState(StrEnum):
    PENDING = "pending"
    ISSUED = "issued"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class Task:
    """Book-keeping of one task (see module docstring)."""

    task_id: int
    rank: int
    start: int = 0
    state: TaskState = TaskState.PENDING
    attempt: int = 0
    gu: int = -1
    consumed: int = 0
    error: str = ""
    regenerations: int = 0


def task_seed(seed: int, task_id: int) -> int:
    """Sampling seed of a task: fixed across attempts, different across tasks and base seeds."""
    return (seed * 1_000_003 + task_id * 7_919 + 17) % (2**31 - 1)


class Database:
    """Scheduled minibatches and their states (see module docstring).

    Args:
        plan: the schedule.
        prompts_by_id: prompt id -> chat-templated text (checked beforehand by `plan.check_prompts`).
        epochs: passes over the schedule; None = as many as asked for (the run stops by iterations).
        max_attempts: sends of one task before it is given up.
        seed: base sampling seed (see `task_seed`).
    """

    def __init__(
        self,
        plan: WorkPlan,
        prompts_by_id: Mapping[Any, str],
        *,
        epochs: int | None = 1,
        max_attempts: int = 3,
        seed: int = 0,
    ) -> None:
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be None or >= 1, got {epochs}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.plan, self.prompts, self.epochs = plan, prompts_by_id, epochs
        self.max_attempts, self.seed = max_attempts, seed
        self.tasks: dict[int, Task] = {}
        self.pending: deque[int] = deque()
        self.retry: deque[int] = deque()
        self.epochs_created = 0
        self.duplicates = 0
        self.failed_attempts = 0
        self.n_issued = 0
        self.given_up: list[Task] = []

    # ---- creation and dispatch -------------------------------------------------------------------------
    def _add_epoch(self) -> bool:
        if self.epochs is not None and self.epochs_created >= self.epochs:
            return False
        base = self.epochs_created * self.plan.n_minibatches
        for rank in range(self.plan.n_minibatches):
            self.tasks[base + rank] = Task(task_id=base + rank, rank=rank)
            self.pending.append(base + rank)
        self.epochs_created += 1
        return True

    def _item(self, task: Task) -> WorkItem:
        ids = list(self.plan.minibatches[task.rank][task.start :])
        return WorkItem(
            task_id=task.task_id,
            minibatch_id=self.plan.minibatch_ids[task.rank],
            group_id=self.plan.group_ids[task.rank],
            attempt=task.attempt,
            prompt_ids=ids,
            prompts=[self.prompts[pid] for pid in ids],
            seed=task_seed(self.seed, task.task_id),
        )

    def _group_key(self, task_id: int) -> tuple[int, int]:
        return task_id // self.plan.n_minibatches, self.plan.group_ids[self.tasks[task_id].rank]

    def next_unit(self, gu: int) -> list[WorkItem]:
        """Issue the next dispatch unit to generation unit `gu` (empty list when nothing is left to issue).

        A failed task is re-issued alone (attempt + 1); otherwise the pending tasks of the head batch group.
        """
        retry = self.next_retry(gu)
        if retry is not None:
            return [retry]
        if not self.pending and not self._add_epoch():
            return []
        key = self._group_key(self.pending[0])
        unit = []
        while self.pending and self._group_key(self.pending[0]) == key:
            unit.append(self._issue(self.tasks[self.pending.popleft()], gu))
        return unit

    def next_retry(self, gu: int) -> WorkItem | None:
        """Re-issue the oldest failed task to generation unit `gu` (attempt + 1); None when none is waiting."""
        if not self.retry:
            return None
        task = self.tasks[self.retry.popleft()]
        task.attempt += 1
        return self._issue(task, gu)

    def next_task(self, gu: int) -> WorkItem | None:
        """Issue the next pending task alone, in dispatch order (no retries; the synchronous mode's per-minibatch
        path, which must not overshoot a round by a whole batch group). None when no new task is left."""
        if not self.pending and not self._add_epoch():
            return None
        return self._issue(self.tasks[self.pending.popleft()], gu)

    def _issue(self, task: Task, gu: int) -> WorkItem:
        task.state, task.gu = TaskState.ISSUED, gu
        self.n_issued += 1
        return self._item(task)

    # ---- results ---------------------------------------------------------------------------------------
    def complete(self, task_id: int) -> bool:
        """Record a completed minibatch; True the first time, False for a duplicate (to be dropped)."""
        task = self.tasks.get(task_id)
        if task is None or task.state == TaskState.DONE:
            self.duplicates += 1
            return False
        if task.state == TaskState.PENDING:
            self.pending.remove(task_id)
        elif task.state == TaskState.FAILED:
            self.retry.remove(task_id)
        else:
            self.n_issued -= 1
        task.state = TaskState.DONE
        return True

    def fail(self, task_id: int, attempt: int, reason: str) -> bool:
        """Record a failed attempt; the task is queued for retry. Stale attempts (already done / re-issued)
        are ignored. Returns False when the task has used all `max_attempts` (it is then given up)."""
        task = self.tasks.get(task_id)
        if task is None or task.state != TaskState.ISSUED or attempt != task.attempt:
            return True
        self.failed_attempts += 1
        self.n_issued -= 1
        task.state, task.error, task.gu = TaskState.FAILED, reason, -1
        if task.attempt - task.regenerations + 1 >= self.max_attempts:
            self.given_up.append(task)
            return False
        self.retry.append(task_id)
        return True

    def issued_to(self, gu: int) -> list[Task]:
        """Tasks currently issued to generation unit `gu`."""
        return [t for t in self.tasks.values() if t.state == TaskState.ISSUED and t.gu == gu]

    def regenerate(self, task_id: int) -> None:
        """Send a completed task again from its first untrained prompt (its samples exceeded the policy-lag
        bound); it goes first, like a retry, and does not count against `max_attempts`."""
        task = self.tasks[task_id]
        if task.state != TaskState.DONE:
            raise ValueError(f"task {task_id} is {task.state}, only a done task can be regenerated")
        task.state, task.start = TaskState.FAILED, task.consumed
        task.regenerations += 1
        self.retry.append(task_id)

    def mark_consumed(self, task_id: int, count: int) -> None:
        """Record that `count` more prompts of task `task_id` were trained (they come in schedule order)."""
        self.tasks[task_id].consumed += count

    # ---- status ----------------------------------------------------------------------------------------
    def count(self, state: TaskState) -> int:
        return sum(1 for t in self.tasks.values() if t.state == state)

    @property
    def has_work(self) -> bool:
        """True while some task is pending, failed (awaiting retry) or could still be created."""
        return bool(self.retry) or self.has_new_work

    @property
    def has_new_work(self) -> bool:
        """True while a task was never issued: pending, or in an epoch not created yet."""
        return bool(self.pending) or self.epochs is None or self.epochs_created < self.epochs

    @property
    def exhausted(self) -> bool:
        """True when every task of every epoch is done."""
        return not self.has_work and self.n_issued == 0

    # ---- checkpoint ------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able position: epochs created and trained-prompt counts (tasks with none are omitted)."""
        consumed = {str(t.task_id): t.consumed for t in self.tasks.values() if t.consumed}
        return {"epochs_created": self.epochs_created, "consumed": consumed}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Rebuild from `state()`: fully trained tasks are done, all others pending from their first
        untrained prompt, in dispatch order."""
        self.tasks.clear()
        self.pending.clear()
        self.retry.clear()
        self.epochs_created = 0
        for _ in range(int(state["epochs_created"])):
            if not self._add_epoch():
                raise ValueError("checkpoint has more epochs than this run allows")
        for key, count in state["consumed"].items():
            task = self.tasks[int(key)]
            size = len(self.plan.minibatches[task.rank])
            if not 0 <= count <= size:
                raise ValueError(f"checkpoint says task {key} trained {count} prompts but it has {size}")
            task.consumed = task.start = int(count)
            if count == size:
                task.state = TaskState.DONE
        self.pending = deque(t.task_id for t in self.tasks.values() if t.state == TaskState.PENDING)
        self.n_issued = 0
