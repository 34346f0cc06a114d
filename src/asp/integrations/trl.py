"""asp's rollout schedule inside TRL's ``GRPOTrainer`` (trl==1.16; ``pip install -e '.[peers]'``).

    from asp.integrations.trl import SchedulePlan, ScheduledGRPOTrainer
    plan = SchedulePlan.from_schedule(schedule, spec, estimator=HistoryEstimator(8.0, 0.05), seed=0)
    trainer = ScheduledGRPOTrainer(
        model=policy_dir, reward_funcs=reward, train_dataset=prompts,   # prompts: a "prompt_id" column
        args=GRPOConfig(per_device_train_batch_size=spec.b * 8, num_generations=8, shuffle_dataset=False, ...),
        asp_plan=plan,
    )
    trainer.train()

What a TRL user gets (docs/integrations.md):

* `ScheduleSampler` (returned by the trainer's ``_get_train_sampler``) yields the schedule's minibatches in dispatch
  order, one minibatch per TRL generation batch, each prompt ``num_generations`` times and each generation batch
  ``num_iterations * steps_per_generation`` times, exactly the layout of TRL's ``RepeatSampler``.
* `HistoryCallback` records every completion's length per prompt (read from the ``completion_ids`` TRL hands its
  reward functions, with the policy version = TRL's ``global_step`` at generation) into asp's
  `asp.schedule.history.LengthHistory`, and keeps the plan's policy version current.
* Each new epoch (TRL asks the sampler for a new pass) after the first is re-scheduled on history-aware loads
  (`LengthHistory.loads` of the schedule's calibrated loads, then `build_schedule` with the same settings), as
  ``runtime.history`` does in asp's own runtime. The first epoch is the given schedule as built.
* A TRL batch layout whose generation batch is not one schedule minibatch raises `ScheduleMismatchError` naming
  TRL's settings and the schedule's minibatch sizes.

Only `asp.schedule` is used: no asp runtime, control core or trainer (import-linter contract).
Tests: tests/integrations/test_trl.py (real TRL on a tiny demo policy).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Sampler
from transformers import TrainerCallback
from trl import GRPOTrainer

from asp.schedule.history import HistoryEstimator, LengthHistory
from asp.schedule.schedule import Schedule, build_schedule
from asp.schedule.spec import ScheduleSpec

PROMPT_ID_COLUMN = "prompt_id"  # the dataset column holding each row's prompt id (the schedule's ids)


class ScheduleMismatchError(ValueError):
    """TRL's generation batch is not one schedule minibatch."""


@dataclass
class SchedulePlan:
    """The schedule TRL walks, epoch by epoch, and the realized lengths that re-plan it.

    Attributes:
        prompt_ids: (n,) every scheduled prompt id.
        prior: (n,) each prompt's calibrated load (the schedule's ``loads``, tokens), the history's prior.
        first: the first epoch's minibatches (prompt ids), in dispatch order.
        spec: the scheduler's settings for the re-plans (b, kappa, k, iterations, method).
        estimator: the history estimator (``runtime.history``'s kappa and delta).
        seed: balancing seed of epoch e is ``seed + e``.
        shuffle: shuffle whole batch groups after balancing.
        history: realized lengths recorded so far.
        version: the trainer's current policy version (TRL's ``global_step``).
        epochs_planned: epochs planned so far.
    """

    prompt_ids: np.ndarray
    prior: np.ndarray
    first: list[np.ndarray]
    spec: ScheduleSpec
    estimator: HistoryEstimator
    seed: int
    shuffle: bool = False
    history: LengthHistory = field(default_factory=LengthHistory)
    version: int = 0
    epochs_planned: int = 0

    @classmethod
    def from_schedule(
        cls, schedule: Schedule, spec: ScheduleSpec, *, estimator: HistoryEstimator, seed: int, shuffle: bool = False
    ) -> SchedulePlan:
        """The plan of a built `Schedule` (the schedule stage's, or `build_schedule`'s) and its settings."""
        return cls(
            prompt_ids=np.asarray(schedule.prompt_ids),
            prior=np.asarray(schedule.loads, dtype=np.float64),
            first=schedule.minibatches(),
            spec=spec,
            estimator=estimator,
            seed=seed,
            shuffle=shuffle,
        )

    @property
    def minibatch_sizes(self) -> list[int]:
        """Distinct minibatch sizes of the first epoch (prompts), ascending."""
        return sorted({int(mb.size) for mb in self.first})

    def next_epoch(self) -> list[np.ndarray]:
        """The next epoch's minibatches in dispatch order: the given schedule first, then history-aware re-plans.

        Raises:
            ScheduleMismatchError: a re-plan cut a minibatch of another size than the first epoch's.
        """
        epoch, self.epochs_planned = self.epochs_planned, self.epochs_planned + 1
        if epoch == 0 or not len(self.history):
            return list(self.first)
        loads = np.maximum(self.history.loads(list(self.prompt_ids), self.prior, self.version, self.estimator), 1e-6)
        schedule = build_schedule(
            self.prompt_ids, loads, **self.spec.kwargs(), seed=self.seed + epoch, loads="raw", shuffle=self.shuffle
        )
        minibatches = schedule.minibatches()
        sizes = sorted({int(mb.size) for mb in minibatches})
        if sizes != self.minibatch_sizes:
            raise ScheduleMismatchError(
                f"the re-plan of epoch {epoch} cut minibatches of {sizes} prompts, the first epoch"
                f" {self.minibatch_sizes} (schedule b {self.spec.b}, kappa {self.spec.kappa}): TRL needs one size;"
                f" use kappa 0 and a prompt count divisible by b"
            )
        return minibatches

    def record(self, prompt_ids: Sequence[Any], lengths: Sequence[int], version: int) -> None:
        """Record one generation batch: completion ``i`` of prompt ``prompt_ids[i]`` had ``lengths[i]`` tokens.

        Completions are grouped per prompt in order of appearance (TRL's layout: each prompt's ``num_generations``
        completions side by side); a prompt with another count than the others is recorded with its own.
        """
        groups: dict[Any, list[int]] = defaultdict(list)
        for pid, length in zip(prompt_ids, lengths, strict=True):
            groups[pid].append(int(length))
        for pid, row in groups.items():
            self.history.add([pid], np.asarray([row], dtype=np.float64), [version])


def check_batch_settings(args: Any, sizes: Sequence[int], spec: ScheduleSpec | None = None) -> int:
    """Prompts per TRL generation batch, checked against the schedule's minibatch `sizes`.

    Args:
        args: TRL's ``GRPOConfig`` (after its ``__post_init__``: ``generation_batch_size`` resolved).
        sizes: distinct minibatch sizes of the schedule (prompts).
        spec: the schedule's settings, named in the message when given.

    Returns:
        ``generation_batch_size // num_generations``.

    Raises:
        ScheduleMismatchError: a minibatch size differs from TRL's prompts per generation batch.
    """
    prompts = int(args.generation_batch_size) // int(args.num_generations)
    if list(sizes) == [prompts]:
        return prompts
    processes = int(args.generation_batch_size) // (int(args.per_device_train_batch_size) * args.steps_per_generation)
    where = f" (schedule b {spec.b}, kappa {spec.kappa})" if spec is not None else ""
    raise ScheduleMismatchError(
        f"TRL generates {prompts} prompts per generation batch (generation_batch_size {args.generation_batch_size} ="
        f" per_device_train_batch_size {args.per_device_train_batch_size} x {processes} process(es) x"
        f" steps_per_generation {args.steps_per_generation}, gradient_accumulation_steps"
        f" {args.gradient_accumulation_steps}, divided by num_generations {args.num_generations}), but the asp"
        f" schedule's minibatches hold {list(sizes)} prompts{where}. One schedule minibatch is one generation batch:"
        f" make per_device_train_batch_size x processes x steps_per_generation = minibatch size x num_generations,"
        f" and build the schedule with kappa 0 and a prompt count divisible by b."
    )


class ScheduleSampler(Sampler[int]):
    """Dataset rows in the plan's dispatch order, in the layout of TRL's ``RepeatSampler`` (each prompt
    `mini_repeat_count` times in a row, each minibatch `repeat_count` times); every `__iter__` is a new epoch."""

    def __init__(self, plan: SchedulePlan, rows: Mapping[Any, int], mini_repeat_count: int, repeat_count: int):
        missing = [p for p in plan.prompt_ids.tolist() if p not in rows]
        if missing:
            raise ValueError(
                f"{len(missing)} scheduled prompt ids are not in the dataset's {PROMPT_ID_COLUMN!r} column"
                f" (first: {missing[:3]}); train on the prompts the schedule was built from"
            )
        self.plan, self.rows = plan, rows
        self.mini_repeat_count, self.repeat_count = mini_repeat_count, repeat_count

    def __len__(self) -> int:
        return len(self.plan.prompt_ids) * self.mini_repeat_count * self.repeat_count

    def __iter__(self) -> Iterator[int]:
        for minibatch in self.plan.next_epoch():
            rows = [self.rows[p] for p in minibatch.tolist()]
            for _ in range(self.repeat_count):
                for row in rows:
                    yield from [row] * self.mini_repeat_count


class HistoryCallback(TrainerCallback):
    """Keeps the plan's policy version at TRL's ``global_step`` and records completion lengths (`wrap_reward`)."""

    def __init__(self, plan: SchedulePlan) -> None:
        self.plan = plan

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.plan.version = int(state.global_step)
        return control

    def wrap_reward(self, reward: Callable[..., Any]) -> Callable[..., Any]:
        """`reward` that first records each completion's length under its prompt id (TRL passes the dataset's
        columns, ``completion_ids`` and ``trainer_state`` to reward functions)."""

        @functools.wraps(reward)
        def recording(*args: Any, **kwargs: Any) -> Any:
            ids = kwargs.get(PROMPT_ID_COLUMN)
            if ids is None:
                raise ValueError(f"the training dataset has no {PROMPT_ID_COLUMN!r} column: asp's plan needs it")
            state = kwargs.get("trainer_state")
            version = int(state.global_step) if state is not None else self.plan.version
            self.plan.record(ids, [len(c) for c in kwargs["completion_ids"]], version)
            return reward(*args, **kwargs)

        return recording


class ScheduledGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` that walks `asp_plan` (`ScheduleSampler`) and re-plans it from TRL's lengths
    (`HistoryCallback`). Takes GRPOTrainer's keyword arguments; ``reward_funcs`` must include a callable."""

    def __init__(self, *, asp_plan: SchedulePlan, **kwargs: Any) -> None:
        callback = HistoryCallback(asp_plan)
        funcs = kwargs.get("reward_funcs")
        funcs = list(funcs) if isinstance(funcs, list | tuple) else [funcs]
        first = next((i for i, f in enumerate(funcs) if callable(f) and not hasattr(f, "config")), None)
        if first is None:
            raise ValueError("ScheduledGRPOTrainer records lengths through a reward function: give one callable")
        funcs[first] = callback.wrap_reward(funcs[first])
        kwargs["reward_funcs"] = funcs
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
        super().__init__(**kwargs)
        self.asp_plan = asp_plan
        check_batch_settings(self.args, asp_plan.minibatch_sizes, asp_plan.spec)

    def _get_train_sampler(self, dataset: Any = None) -> Sampler:
        dataset = self.train_dataset if dataset is None else dataset
        rows = {pid: i for i, pid in enumerate(dataset[PROMPT_ID_COLUMN])}
        return ScheduleSampler(
            self.asp_plan,
            rows,
            mini_repeat_count=self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
        )
