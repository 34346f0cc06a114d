"""The Control Unit's Database (paper appendix B.2): scheduled minibatches and their state, in schedule order.

Each unit of work is a *task*: one scheduled minibatch in one pass (epoch) over the schedule, with id
``epoch * n_minibatches + dispatch_rank`` (ids are handed out in creation order; after a replan they simply
continue). States::

    pending --issue--> issued --complete--> done          (first completion wins; later ones are duplicates)
       |                 |
       |                 +--fail--> failed --(next_unit re-issues, attempt + 1)--> issued
       |                              `--(max_attempts used)--> given up: the run stops with the last error
       `--replan--> replaced                  (its untrained prompts moved to a task of the new plan)

With partial rollouts (`asp.control.partial`) a task whose first output came back with unfinished responses is
*held* (`hold`): it stays issued (it counts in `n_issued`, so the pass is not exhausted) but belongs to no GU any
more (losing a GU does not re-issue it), and its responses live in `partials` until every one finished; then it
completes like any task. `state()` keeps the held tasks with their responses so far, and `restore` holds them again,
so a resumed run continues them instead of generating them again.

`next_unit` hands out dispatch units: a failed task alone (retries first), else the rest of the head
batch group; the synchronous mode takes retries (`next_retry`) and single tasks (`next_task`) instead.
Trained prompts are counted per task (`mark_consumed`); the checkpoint `state()` keeps only those counts, so
on `restore` every task that was not fully trained is pending again with its trained prompts cut off: nothing
is trained twice or lost across a restart. The realized lengths of the trained prompts (`history`, a
`asp.schedule.history.LengthHistory` the core fills when a step finishes, with history-aware passes on) are saved
and restored with those counts, so they too hold every trained prompt exactly once; `on_new_pass` lets the core
re-plan the next passes just before dispatch creates one (a replan with ``reason``, replayed on restore like any
other). Pure Python, no Ray.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from asp.control.messages import MinibatchOutput, WorkItem
from asp.control.partial import HeldTask, PartialStore
from asp.control.plan import WorkPlan, check_prompts
from asp.schedule.history import LengthHistory


class TaskState(StrEnum):
    PENDING = "pending"
    ISSUED = "issued"
    DONE = "done"
    FAILED = "failed"
    REPLACED = "replaced"


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
    epoch: int = 0
    version: int = 1  # plan version that scheduled it
    rest: bool = False  # True: `rank` indexes the `rest` plan of its version, else the `full` one


def task_seed(seed: int, task_id: int) -> int:
    """Sampling seed of a task: fixed across attempts, different across tasks and base seeds."""
    return (seed * 1_000_003 + task_id * 7_919 + 17) % (2**31 - 1)


class Database:
    """Scheduled minibatches and their states (see module docstring).

    Args:
        plan: the schedule (plan version 1; `replan` adds later versions).
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
        max_attempts: int,
        seed: int,
    ) -> None:
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be None or >= 1, got {epochs}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.prompts, self.epochs = prompts_by_id, epochs
        self.max_attempts, self.seed = max_attempts, seed
        self.tasks: dict[int, Task] = {}
        self.pending: deque[int] = deque()
        self.retry: deque[int] = deque()
        self.epochs_created = 0
        self.duplicates = 0
        self.failed_attempts = 0
        self.n_issued = 0
        self.given_up: list[Task] = []
        self.partials = PartialStore()  # held tasks (partial rollouts)
        self.history = LengthHistory()  # realized lengths of trained prompts (`runtime.history`), checkpointed
        self.on_new_pass: Callable[[], None] | None = None  # called before dispatch creates a pass after the first
        self.original = plan
        self._reset_plans()

    def _reset_plans(self) -> None:
        self.plan = self.original  # the plan of every pass created from now on
        self.version = 1  # current plan version
        self.plans: dict[int, tuple[WorkPlan | None, WorkPlan]] = {1: (None, self.original)}  # version -> rest, full
        self.partials.predicted = dict(self.original.predicted)  # the current plan's loads (online order)
        self.replans: list[dict[str, Any]] = []  # JSON-able history, part of `state()`
        self.next_id = 0

    # ---- creation and dispatch -------------------------------------------------------------------------
    def _new_task(self, epoch: int, rank: int, rest: bool) -> int:
        task_id, self.next_id = self.next_id, self.next_id + 1
        self.tasks[task_id] = Task(task_id=task_id, rank=rank, epoch=epoch, version=self.version, rest=rest)
        return task_id

    def _add_epoch(self) -> bool:
        if self.epochs is not None and self.epochs_created >= self.epochs:
            return False
        for rank in range(self.plan.n_minibatches):
            self.pending.append(self._new_task(self.epochs_created, rank, rest=False))
        self.epochs_created += 1
        return True

    def _next_epoch(self) -> bool:
        """Dispatch reached a pass boundary: let `on_new_pass` replan the next passes, then create the next pass."""
        if self.on_new_pass is not None and self.epochs_created >= 1 and self.has_new_work:
            self.on_new_pass()
        return self._add_epoch()

    def _plan_of(self, task: Task) -> WorkPlan:
        rest, full = self.plans[task.version]
        if not task.rest:
            return full
        if rest is None:  # rest tasks are only created for plan versions that have a rest plan
            raise RuntimeError(f"task {task.task_id} is a rest task but plan version {task.version} has none")
        return rest

    def _untrained(self, task: Task) -> list[Any]:
        return list(self._plan_of(task).minibatches[task.rank][task.start :])

    def _item(self, task: Task) -> WorkItem:
        plan, ids = self._plan_of(task), self._untrained(task)
        return WorkItem(
            task_id=task.task_id,
            minibatch_id=plan.minibatch_ids[task.rank],
            group_id=plan.group_ids[task.rank],
            attempt=task.attempt,
            prompt_ids=ids,
            prompts=[self.prompts[pid] for pid in ids],
            seed=task_seed(self.seed, task.task_id),
        )

    def _group_key(self, task_id: int) -> tuple[int, int, bool, int]:
        task = self.tasks[task_id]
        return task.epoch, task.version, task.rest, self._plan_of(task).group_ids[task.rank]

    def next_unit(self, gu: int) -> list[WorkItem]:
        """Issue the next dispatch unit to generation unit `gu` (empty list when nothing is left to issue).

        A failed task is re-issued alone (attempt + 1); otherwise the pending tasks of the head batch group.
        """
        retry = self.next_retry(gu)
        if retry is not None:
            return [retry]
        if not self.pending and not self._next_epoch():
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
        if not self.pending and not self._next_epoch():
            return None
        return self._issue(self.tasks[self.pending.popleft()], gu)

    def _issue(self, task: Task, gu: int) -> WorkItem:
        task.state, task.gu = TaskState.ISSUED, gu
        self.n_issued += 1
        return self._item(task)

    # ---- results ---------------------------------------------------------------------------------------
    def hold(self, out: MinibatchOutput) -> bool:
        """Partial rollouts: keep a task's first output, which has unfinished responses (`PartialStore.hold`); the
        task stays issued, to no GU. False (a duplicate, dropped) unless the task is issued and not held yet."""
        task = self.tasks.get(out.task_id)
        if task is None or task.state != TaskState.ISSUED or out.task_id in self.partials.tasks:
            self.duplicates += 1
            return False
        task.gu = -1
        self.partials.hold(out)
        return True

    def complete(self, task_id: int) -> bool:
        """Record a completed minibatch; True the first time, False for a duplicate (to be dropped)."""
        task = self.tasks.get(task_id)
        if task is None or task.state in (TaskState.DONE, TaskState.REPLACED):
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
        if task is None or task.state != TaskState.ISSUED or attempt != task.attempt or task_id in self.partials.tasks:
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

    def retire_held(self, task_id: int, regenerate: bool) -> HeldTask:
        """A held task that can no longer train (`PartialStore.stale_tasks`) leaves the store and its rows the pool:
        sent again from its first untrained prompt, first, like `regenerate` (`regenerate`), or dropped: its prompts
        count as consumed, never trained. Returns the held task (its responses so far, for the counts)."""
        held = self.partials.tasks[task_id]
        self.partials.drop_task(task_id)
        task = self.tasks[task_id]
        self.n_issued -= 1
        if regenerate:
            task.state, task.start, task.gu = TaskState.FAILED, task.consumed, -1
            task.regenerations += 1
            self.retry.append(task_id)
        else:
            task.state = TaskState.DONE
            task.consumed += len(held.head.prompt_ids)
        return held

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

    def plan_version(self, task_id: int | None = None) -> int:
        """Plan version that scheduled task `task_id` (1 = the run's original plan); None: the current version."""
        return self.version if task_id is None else self.tasks[task_id].version

    def trained_counts(self) -> dict[Any, int]:
        """Prompt id -> times it was consumed (trained, or dropped by the lag bound) over all tasks and passes."""
        counts: Counter[Any] = Counter()
        for task in self.tasks.values():
            counts.update(self._plan_of(task).minibatches[task.rank][: task.consumed])
        return dict(counts)

    # ---- replanning ------------------------------------------------------------------------------------
    def _scope(self) -> list[int]:
        """The pending tasks a replan swaps: those of the newest pass with pending work, in dispatch order (all
        pending tasks, except after restoring a multi-pass run that left work in an older pass too)."""
        if not self.pending:
            return []
        last = max(self.tasks[t].epoch for t in self.pending)
        return [t for t in self.pending if self.tasks[t].epoch == last]

    def pending_minibatches(self) -> list[list[Any]]:
        """Untrained prompt ids of every task a replan would swap, one list per task, in dispatch order."""
        return [self._untrained(self.tasks[t]) for t in self._scope()]

    def pending_prompts(self) -> list[Any]:
        """The remaining prompts in dispatch order: exactly what `replan`'s `rest` must cover."""
        return [pid for mb in self.pending_minibatches() for pid in mb]

    def pending_plan(self) -> WorkPlan | None:
        """The remaining work as a `WorkPlan` (groups renumbered 0, 1, ... by dispatch unit); None when none."""
        scope = self._scope()
        if not scope:
            return None
        keys = [self._group_key(t) for t in scope]
        groups = [0]
        for a, b in zip(keys, keys[1:], strict=False):
            groups.append(groups[-1] + (a != b))
        mb_ids = [self._plan_of(self.tasks[t]).minibatch_ids[self.tasks[t].rank] for t in scope]
        return WorkPlan.from_lists(self.pending_minibatches(), groups, mb_ids)

    def pass_due(self, reason: str) -> bool:
        """True at a pass boundary not yet re-planned with `reason`: nothing pending, at least one pass created and
        another one still to create."""
        if self.pending or self.epochs_created < 1 or not self.has_new_work:
            return False
        return not self._replanned(reason, self.epochs_created)

    def _replanned(self, reason: str, epochs_created: int) -> bool:
        """A replan with `reason` was made when `epochs_created` passes had been created."""
        return any(r.get("reason") == reason and r["epochs_created"] == epochs_created for r in self.replans)

    def catch_up_due(self, after: str, reason: str, min_tasks: int = 1) -> bool:
        """True when the newest pass was planned at its boundary (a replan with reason `after`), is not re-planned
        with `reason` yet, still has at least `min_tasks` tasks pending (none of an older pass) and every prompt
        of the older passes is trained: what was in flight at the boundary has reached the history."""
        newest = self.epochs_created - 1
        if newest < 1 or len(self.pending) < min_tasks:
            return False
        if any(self.tasks[t].epoch != newest for t in self.pending):
            return False
        if not self._replanned(after, newest) or self._replanned(reason, self.epochs_created):
            return False
        return all(
            t.consumed >= len(self._plan_of(t).minibatches[t.rank])
            for t in self.tasks.values()
            if t.epoch < newest and t.state != TaskState.REPLACED
        )

    def replan(self, rest: WorkPlan | None, full: WorkPlan | None = None, reason: str = "") -> int:
        """Swap the pending tasks for the tasks of `rest`; later passes use `full`. Returns the new plan version.

        Args:
            rest: plan over exactly `pending_prompts()` (its minibatches, groups and dispatch order are used);
                None only when nothing is pending.
            full: the plan of every pass created after this call; None keeps the current one.
            reason: kept in the replan's record (e.g. `asp.control.history.PASS_REASON`); empty: not kept.

        Raises:
            ValueError: `rest` does not cover exactly the remaining prompts (the message names the difference).
            UserError: a prompt of `full` has no text.
        """
        scope = self._scope()
        want = Counter(pid for t in scope for pid in self._untrained(self.tasks[t]))
        got = Counter(rest.prompt_ids() if rest is not None else [])
        if want != got:
            missing, extra = list((want - got).elements()), list((got - want).elements())
            raise ValueError(
                f"the new plan must cover exactly the {sum(want.values())} remaining prompts, but it lacks "
                f"{len(missing)} (e.g. {missing[:5]}) and has {len(extra)} others (e.g. {extra[:5]})"
            )
        if full is not None:
            check_prompts(full, self.prompts)
        record = {
            "epochs_created": self.epochs_created,
            "replaced": scope,
            "first_id": self.next_id,
            "rest": _plan_json(rest),
            "full": _plan_json(full),
        }
        if reason:
            record["reason"] = reason
        self._apply_replan(scope, rest, full)
        self.replans.append(record)
        return self.version

    def _apply_replan(self, scope: list[int], rest: WorkPlan | None, full: WorkPlan | None) -> None:
        epoch = self.tasks[scope[0]].epoch if scope else self.epochs_created
        for task_id in scope:
            self.tasks[task_id].state = TaskState.REPLACED
        swapped = set(scope)
        self.pending = deque(t for t in self.pending if t not in swapped)
        self.version += 1
        self.plan = full if full is not None else self.plan
        self.plans[self.version] = (rest, self.plan)
        for plan in (full, rest):  # the new loads win (a re-plan's rest covers the pending prompts)
            if plan is not None:
                self.partials.predicted = {**self.partials.predicted, **plan.predicted}
        for rank in range(rest.n_minibatches if rest is not None else 0):
            self.pending.append(self._new_task(epoch, rank, rest=True))

    # ---- checkpoint ------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able position: epochs created and trained-prompt counts (tasks with none are omitted), plus the
        replans (``replans``, only when there were any), the held tasks of partial rollouts (``partials``, only
        when there are any) and the realized lengths of the trained prompts (``history``, only when recorded)."""
        consumed = {str(t.task_id): t.consumed for t in self.tasks.values() if t.consumed}
        state: dict[str, Any] = {"epochs_created": self.epochs_created, "consumed": consumed}
        if self.replans:
            state["replans"] = [dict(r) for r in self.replans]
        if self.partials.tasks:
            state["partials"] = self.partials.state()
        if len(self.history):
            state["history"] = self.history.state()
        return state

    def restore(self, state: Mapping[str, Any]) -> None:
        """Rebuild from `state()`: replans are replayed, fully trained tasks are done, all others (but replaced
        ones) pending from their first untrained prompt, in dispatch order; held tasks (``partials``) are issued
        again, to no GU, with their responses so far."""
        self.tasks.clear()
        self.pending.clear()
        self.retry.clear()
        self.epochs_created = 0
        self._reset_plans()
        for record in state.get("replans", []):
            self._replay(record)
        self._add_epochs(int(state["epochs_created"]))
        for key, count in state["consumed"].items():
            task = self.tasks.get(int(key))
            if task is None:
                raise ValueError(f"checkpoint names task {key}, which this run's plan and replans never created")
            size = len(self._plan_of(task).minibatches[task.rank])
            if not 0 <= count <= size:
                raise ValueError(f"checkpoint says task {key} trained {count} prompts but it has {size}")
            task.consumed = task.start = int(count)
            if count == size and task.state == TaskState.PENDING:
                task.state = TaskState.DONE
        self.n_issued = 0
        self._restore_partials(state.get("partials", {}))
        self.history = LengthHistory.from_state(state.get("history", []))
        pending = [t for t in self.tasks.values() if t.state == TaskState.PENDING]
        self.pending = deque(t.task_id for t in sorted(pending, key=lambda t: (t.epoch, t.task_id)))

    def _restore_partials(self, partials: Mapping[str, Any]) -> None:
        """Hold again the tasks a checkpoint kept in flight (each must be pending with exactly those prompts)."""
        self.partials.restore(partials)
        for task_id, held in self.partials.tasks.items():
            task = self.tasks.get(task_id)
            if task is None or task.state != TaskState.PENDING:
                raise ValueError(f"checkpoint holds a partial task {task_id} that this run has no pending task for")
            if list(held.head.prompt_ids) != self._untrained(task):
                raise ValueError(f"checkpoint's partial task {task_id} has other prompts than the plan's task")
            task.state, task.gu = TaskState.ISSUED, -1
            self.n_issued += 1

    def _add_epochs(self, upto: int) -> None:
        while self.epochs_created < upto:
            if not self._add_epoch():
                raise ValueError("checkpoint has more epochs than this run allows")

    def _replay(self, record: Mapping[str, Any]) -> None:
        """Redo one replan of a checkpoint's history (tasks created in the same order get the same ids)."""
        self._add_epochs(int(record["epochs_created"]))
        scope = [int(t) for t in record["replaced"]]
        if any(self.tasks.get(t) is None or self.tasks[t].state != TaskState.PENDING for t in scope):
            raise ValueError(f"checkpoint replan {record} replaces tasks this run does not have")
        if self.next_id != int(record["first_id"]):
            raise ValueError(f"checkpoint replan expects task ids from {record['first_id']}, not {self.next_id}")
        self._apply_replan(scope, _plan_from_json(record["rest"]), _plan_from_json(record["full"]))
        self.replans.append(dict(record))


def _plan_json(plan: WorkPlan | None) -> dict[str, list] | None:
    """A plan as JSON-able lists (None stays None); its loads as [prompt id, load] pairs when it has any."""
    if plan is None:
        return None
    data: dict[str, list] = {
        "minibatches": [list(mb) for mb in plan.minibatches],
        "group_ids": list(plan.group_ids),
        "minibatch_ids": list(plan.minibatch_ids),
    }
    if plan.predicted:
        data["predicted"] = [[pid, float(x)] for pid, x in plan.predicted.items()]
    return data


def _plan_from_json(data: Mapping[str, list] | None) -> WorkPlan | None:
    if data is None:
        return None
    predicted = {pid: float(x) for pid, x in data.get("predicted", [])}
    return WorkPlan.from_lists(data["minibatches"], data["group_ids"], data["minibatch_ids"], predicted)
