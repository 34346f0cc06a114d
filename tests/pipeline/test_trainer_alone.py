"""The trainer_alone stage: the GRPO trainer's step timed alone in the pipeline's sitting (asp.pipeline.trainer_alone).

The stage runs on the session's tiny demo policy (a real hf engine decodes the batch, the real GRPO trainer steps on
it at learning rate 0); `why_untimed` and `step_times` are checked on their own, the latter with the real simulated
trainer (a fixed step time).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from asp.control.queue import assemble_batch, sample_offsets
from asp.demo.task import generate_problems
from asp.pipeline import trainer_alone
from asp.steps.loaders import load_policy_tokenizer
from asp.steps.paths import rebase
from asp.tracking import MlflowTracker, end_run
from asp.trainers.simulated import SimulatedTrainer

from .conftest import Built, chat_template, make_params, write_prompts

BATCH, N = 3, 2
RUNTIME = {
    "global_batch_prompts": BATCH,
    "sampling": {"n_samples": N, "max_new_tokens": 8},
    "grpo": {"num_threads": 1, "micro_batch_tokens": 2048},
    "trainer": {"kind": "grpo"},
}


def _paths(root: Path, policy_dir: Path) -> trainer_alone.Paths:
    paths = rebase(trainer_alone.Paths(policy=policy_dir), root)
    template = chat_template(load_policy_tokenizer(policy_dir))
    write_prompts(paths.prompts.parent, generate_problems(6, seed=5), {"profile": list(range(6))}, template)
    return paths


def test_the_demo_s_settings_are_timed_and_every_other_says_why() -> None:
    assert trainer_alone.why_untimed(make_params({"runtime": RUNTIME})) == ""
    assert trainer_alone.why_untimed(make_params()) == ""  # the demo: GRPO, two shared cores, the probe's slowdowns
    for overlay, named in [
        ({"simulate": {"enabled": False}}, "simulate.enabled is false"),
        ({"simulate": {"full_speed": "params"}}, "simulate.full_speed: params"),
        ({"simulate": {"cores": None}}, "simulate.cores is null"),
        ({"simulate": {"sharing": "processor"}}, "simulate.sharing: processor"),
        ({"simulate": {"time_model": "h100-qwen3-8b"}}, "simulate.time_model is the preset 'h100-qwen3-8b'"),
        ({"runtime": {"trainer": {"kind": "simulated"}}}, "runtime.trainer.kind: simulated"),
    ]:
        assert named in trainer_alone.why_untimed(make_params(overlay))


def test_step_times_times_the_steps_after_the_warm_up() -> None:
    trainer = SimulatedTrainer(0.02, 0.0)
    lengths = np.array([3, 4], np.int32)
    out_batch = _one_prompt_batch(lengths)
    times = trainer_alone.step_times(trainer, out_batch, warmup=2, steps=3)
    assert len(times) == 3 and trainer.version == 5  # two untimed, three timed
    assert all(0.02 <= t < 0.5 for t in times)
    metrics = trainer_alone.alone_metrics(times, out_batch)
    assert metrics["trainer_alone/step_s"] == pytest.approx(float(np.median(times)))
    assert (metrics["trainer_alone/sequences"], metrics["trainer_alone/response_tokens"]) == (2, 7)
    with pytest.raises(ValueError, match="steps >= 1"):
        trainer_alone.step_times(trainer, out_batch, steps=0)


def _one_prompt_batch(lengths: np.ndarray):
    from asp.control.messages import MinibatchOutput

    out = MinibatchOutput(
        task_id=0, minibatch_id=0, attempt=0, gu=0, actor=0, policy_version=0, prompt_ids=[0], n=lengths.size,
        lengths=lengths, stopped=np.ones(lengths.size, bool), token_ids=np.ones(int(lengths.sum()), np.int32),
        logprobs=np.zeros(0, np.float32), prompt_tokens=np.array([5], np.int32), texts=["a"] * lengths.size,
        gen_start=0.0, gen_end=1.0,
    )  # fmt: skip
    return assemble_batch(1, out.n, [(out, 0, 1, sample_offsets(out.lengths))])


def test_the_stage_times_the_grpo_step_on_the_engine_s_batch(
    tmp_path: Path, demo_policy: Built, new_tracker: Callable[[str], MlflowTracker]
) -> None:
    paths = _paths(tmp_path, demo_policy.paths.out_dir)
    tracker = new_tracker("trainer_alone")
    metrics = trainer_alone.run(make_params({"runtime": RUNTIME}), paths, tracker)
    end_run(tracker)
    assert metrics["trainer_alone/timed"] == 1 and metrics["trainer_alone/steps"] == trainer_alone.STEPS
    assert (metrics["trainer_alone/prompts"], metrics["trainer_alone/sequences"]) == (BATCH, BATCH * N)
    assert 1 <= metrics["trainer_alone/response_tokens"] <= BATCH * N * 8
    low, mid, high = (metrics[f"trainer_alone/step{k}_s"] for k in ("_min", "", "_max"))
    assert 0 < low <= mid <= high < metrics["trainer_alone/wall_s"]
    assert json.loads(paths.metrics.read_text()) == pytest.approx(metrics)
    run = tracker.client.get_run(tracker.run_id).data
    assert run.metrics["trainer_alone/step_s"] == pytest.approx(mid)


def test_a_setting_the_simulator_does_not_time_writes_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], new_tracker: Callable[[str], MlflowTracker]
) -> None:
    paths = rebase(trainer_alone.Paths(), tmp_path)  # no policy, no prompts: nothing is read
    tracker = new_tracker("trainer_alone_untimed")
    metrics = trainer_alone.run(make_params({"runtime": {"trainer": {"kind": "simulated"}}}), paths, tracker)
    end_run(tracker)
    assert metrics == {"trainer_alone/timed": 0} == json.loads(paths.metrics.read_text())
    assert "trainer_alone: not timed: runtime.trainer.kind: simulated computes nothing" in capsys.readouterr().err


def test_missing_prompts_are_named(tmp_path: Path, demo_policy: Built) -> None:
    from asp.errors import UserError

    paths = rebase(trainer_alone.Paths(policy=demo_policy.paths.out_dir), tmp_path)
    with pytest.raises(UserError, match=r"profile.parquet: missing. Run the prepare stage first"):
        trainer_alone.batch_prompts(paths, BATCH)
