"""asp's schedule inside real TRL (trl==1.16, the peers extra): the sampler has TRL's RepeatSampler layout over the
dispatch order, a batch layout that is not one minibatch per generation batch is refused naming both, and a real
GRPOTrainer on a tiny random demo policy generates the schedule's minibatches in dispatch order, records every
completion's length per prompt, and re-plans the second epoch on history-aware loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402
from trl.trainer.utils import RepeatSampler  # noqa: E402

from asp.demo.task import generate_problems, reward  # noqa: E402
from asp.integrations.trl import (  # noqa: E402
    PROMPT_ID_COLUMN,
    ScheduledGRPOTrainer,
    ScheduleMismatchError,
    SchedulePlan,
    ScheduleSampler,
    check_batch_settings,
)
from asp.schedule import ScheduleSpec, build_schedule  # noqa: E402
from asp.schedule.history import HistoryEstimator, LengthHistory  # noqa: E402
from tests.trainers.test_heldout import save_tiny_demo_policy  # noqa: E402

SPEC = ScheduleSpec(b=2, kappa=0, k=2, iterations=0, method="asp")
ESTIMATOR = HistoryEstimator(prior_samples=1.0, drift_per_version=0.0)


def make_plan(n: int = 8) -> SchedulePlan:
    ids = np.arange(100, 100 + n)
    predicted = np.linspace(10.0, 80.0, n)[::-1].copy()  # longest first in the data: the schedule reorders
    return SchedulePlan.from_schedule(
        build_schedule(ids, predicted, **SPEC.kwargs(), seed=0), SPEC, estimator=ESTIMATOR, seed=0
    )


def grpo_config(tmp_path: Path, **overrides) -> GRPOConfig:
    settings = dict(
        output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, gradient_checkpointing=False, report_to=[],
        save_strategy="no", logging_steps=1, disable_tqdm=True, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=6, num_train_epochs=2, shuffle_dataset=False, learning_rate=1e-3, beta=0.0, seed=0,
    )  # fmt: skip
    settings.update(overrides)
    return GRPOConfig(**settings)


def test_sampler_is_repeat_sampler_over_the_dispatch_order() -> None:
    plan = make_plan()
    order = np.concatenate(plan.first)
    rows = {int(pid): i for i, pid in enumerate(plan.prompt_ids[::-1])}  # dataset rows in another order
    ours = list(ScheduleSampler(plan, rows, mini_repeat_count=2, repeat_count=3))
    trl = RepeatSampler(
        [rows[int(p)] for p in order], mini_repeat_count=2, batch_size=2, repeat_count=3, shuffle=False
    )
    assert ours == [[rows[int(p)] for p in order][i] for i in trl]  # TRL's own layout over the dispatch order
    assert len(ours) == 8 * 2 * 3


def test_mismatch_names_trl_settings_and_the_minibatch_size(tmp_path: Path) -> None:
    args = grpo_config(tmp_path, per_device_train_batch_size=6, num_generations=2)  # 3 prompts per generation batch
    with pytest.raises(ScheduleMismatchError) as err:
        check_batch_settings(args, [2], SPEC)
    text = str(err.value)
    parts = ["3 prompts per generation batch", "per_device_train_batch_size 6", "num_generations 2"]
    parts += ["steps_per_generation 1", "gradient_accumulation_steps 1", "[2] prompts", "schedule b 2, kappa 0"]
    for part in parts:
        assert part in text, text
    assert check_batch_settings(grpo_config(tmp_path), [2]) == 2


def test_replan_refuses_a_second_minibatch_size() -> None:
    ids = np.arange(7)  # 7 prompts, b 2: one short minibatch
    spec = ScheduleSpec(b=2, kappa=1, k=1, iterations=0, method="asp")
    plan = SchedulePlan.from_schedule(
        build_schedule(ids, np.arange(1.0, 8.0), **spec.kwargs(), seed=0), spec, estimator=ESTIMATOR, seed=0
    )
    assert len(plan.minibatch_sizes) == 2  # 2 and 3: TRL's check refuses this plan before training
    with pytest.raises(ScheduleMismatchError, match="process"):
        check_batch_settings(grpo_config(Path("/tmp")), plan.minibatch_sizes, spec)


def test_real_grpo_trainer_walks_and_replans_the_schedule(tmp_path: Path) -> None:
    policy = save_tiny_demo_policy(tmp_path / "policy")
    records = generate_problems(8, seed=3)
    plan = make_plan()
    dataset = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": r["problem"]}] for r in records],
        "answer": [r["answer"] for r in records],
        PROMPT_ID_COLUMN: [int(p) for p in plan.prompt_ids[::-1]],  # dataset order is not the schedule's
    })  # fmt: skip
    seen: list[list[int]] = []

    def demo_reward(completions, answer, prompt_id, **_):
        seen.append(list(dict.fromkeys(prompt_id)))  # the generation batch's prompts, in order
        return [reward(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]

    trainer = ScheduledGRPOTrainer(
        model=str(policy), reward_funcs=demo_reward, args=grpo_config(tmp_path), train_dataset=dataset, asp_plan=plan
    )
    trainer.train()
    first = [mb.tolist() for mb in plan.first]
    assert seen[:4] == first  # epoch 1: the schedule's minibatches in dispatch order, one per generation batch
    assert plan.epochs_planned == 2 and trainer.state.global_step == 8
    assert sorted(plan.history.visits) == sorted(plan.prompt_ids.tolist())
    visits = [v for pid in plan.prompt_ids.tolist() for v in plan.history.visits[pid]]
    assert all(n == 2 and 0 <= m <= 6 for _, n, m in visits) and len(visits) == 16  # 2 samples, 2 epochs each
    # epoch 2 ran the re-plan on history-aware loads of epoch 1's lengths (policy version 4: after epoch 1's steps)
    first_visits = LengthHistory({pid: plan.history.visits[pid][:1] for pid in plan.prompt_ids.tolist()})
    loads = first_visits.loads(plan.prompt_ids.tolist(), plan.prior, 4, ESTIMATOR)
    expected = build_schedule(plan.prompt_ids, loads, **SPEC.kwargs(), seed=1, loads="raw").minibatches()
    assert seen[4:] == [mb.tolist() for mb in expected]


def test_next_epoch_replans_on_the_recorded_lengths() -> None:
    plan = make_plan()
    plan.estimator = HistoryEstimator(prior_samples=0.0, drift_per_version=0.0)  # history only
    assert [mb.tolist() for mb in plan.next_epoch()] == [mb.tolist() for mb in plan.first]  # epoch 1: as built
    ids = plan.prompt_ids.tolist()
    realized = {pid: 5.0 + 7.0 * ((pid * 5) % 8) for pid in ids}  # an order unrelated to the predictions
    plan.record([p for p in ids for _ in range(2)], [int(realized[p]) for p in ids for _ in range(2)], version=4)
    assert plan.history.visits[ids[0]] == [(4, 2, realized[ids[0]])]
    expected = build_schedule(plan.prompt_ids, np.array([realized[p] for p in ids]), **SPEC.kwargs(), seed=1)
    assert [mb.tolist() for mb in plan.next_epoch()] == [mb.tolist() for mb in expected.minibatches()]
    assert plan.epochs_planned == 2


def test_steps_per_generation_keep_one_minibatch_per_generation_batch(tmp_path: Path) -> None:
    policy = save_tiny_demo_policy(tmp_path / "policy")
    plan = make_plan()
    records = generate_problems(8, seed=3)
    dataset = Dataset.from_dict({
        "prompt": [r["problem"] for r in records], "answer": [r["answer"] for r in records],
        PROMPT_ID_COLUMN: [int(p) for p in plan.prompt_ids],
    })  # fmt: skip
    seen: list[list[int]] = []

    def demo_reward(completions, prompt_id, **_):
        seen.append(list(dict.fromkeys(prompt_id)))
        return [0.0] * len(completions)

    # 2 samples per micro-batch x 2 steps per generation = 4 samples = 2 prompts x 2 generations per generation batch
    args = grpo_config(tmp_path, per_device_train_batch_size=2, steps_per_generation=2, num_train_epochs=1)
    trainer = ScheduledGRPOTrainer(
        model=str(policy), reward_funcs=demo_reward, args=args, train_dataset=dataset, asp_plan=plan
    )
    trainer.train()
    assert seen == [mb.tolist() for mb in plan.first]  # one generation per minibatch, in dispatch order
    assert trainer.state.global_step == 8  # two optimizer steps per generation batch
