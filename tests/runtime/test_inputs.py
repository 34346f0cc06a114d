"""Bad input is refused before anything starts: config ranges, schedule vs prompt set, schedule layouts."""

from __future__ import annotations

import pandas as pd
import pytest
from pydantic import ValidationError

from asp.errors import UserError
from asp.runtime import EngineSpec, RuntimeConfig, WorkPlan, as_plan, check_prompts, run_async
from asp.schedule import schedule_to_frame
from asp.trainers import make_trainer_factory
from tests.schedules import tiny_schedule

from .helpers import fast_config, make_plan


def test_q_max_below_one_global_batch_is_refused():
    with pytest.raises(ValidationError, match=r"runtime.queue.q_max = 8 is smaller than one global batch"):
        RuntimeConfig(global_batch_prompts=16, queue={"q_max": 8})


def test_resume_level_that_could_deadlock_is_refused():
    # paused at 3..7 prompts with batches of 8: no batch can form and generation would never resume
    with pytest.raises(
        ValidationError,
        match=r"q_resume = 2 must lie in \[runtime.global_batch_prompts - 1 = 7, runtime.queue.q_max = 16",
    ):
        RuntimeConfig(global_batch_prompts=8, queue={"q_max": 16, "q_resume": 2})
    assert RuntimeConfig(global_batch_prompts=8, queue={"q_max": 8}).resume_depth == 7
    assert RuntimeConfig(global_batch_prompts=16, queue={"q_max": 48}).resume_depth == 32


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [("sampling", "n_samples", 0), ("sampling", "top_p", 0.0), ("ray", "actors_per_unit", 0)],
)
def test_out_of_range_fields_are_named(section, field, value):
    with pytest.raises(ValidationError, match=rf"{section}.{field}\n  Input should be greater than"):
        RuntimeConfig(**{section: {field: value}})


def test_unknown_param_is_refused():
    with pytest.raises(ValidationError, match="q_maximum\n  Extra inputs are not permitted"):
        RuntimeConfig(q_maximum=3)


def test_schedule_prompts_missing_from_prompt_set():
    plan, prompts = make_plan(3, 2)
    del prompts[4]
    with pytest.raises(UserError, match=r"1 of 6 scheduled prompts are not in the prompt set, e\.g\. \[4\]"):
        check_prompts(plan, prompts)
    # run_async refuses it before touching Ray (no cluster fixture here)
    cfg = fast_config()
    with pytest.raises(UserError, match="not in the prompt set"):
        run_async(plan, prompts, EngineSpec("standin"), cfg, trainer_factory=make_trainer_factory("simulated", cfg))


def test_bad_plans():
    with pytest.raises(UserError, match="appears more than once"):
        WorkPlan.from_lists([[1, 2], [2, 3]])
    with pytest.raises(UserError, match="non-decreasing"):
        WorkPlan.from_lists([[1], [2]], group_ids=[1, 0])
    with pytest.raises(UserError, match="empty"):
        WorkPlan.from_lists([[1], []])


def test_missing_model_directory_is_refused_before_ray(tmp_path):
    plan, prompts = make_plan(2, 2)
    cfg = fast_config()
    with pytest.raises(UserError, match="does not exist"):
        run_async(
            plan,
            prompts,
            EngineSpec("hf", str(tmp_path / "nope")),
            cfg,
            trainer_factory=make_trainer_factory("simulated", cfg),
        )


def test_plan_from_schedule_and_its_parquet_frame_agree():
    ids = [f"p{i}" for i in range(12)]
    sched = tiny_schedule(ids, [10, 90, 20, 80, 30, 70, 40, 60, 50, 55, 45, 65])
    from_sched = as_plan(sched)
    # minibatch blocks in reverse order (rows inside a minibatch keep theirs): dispatch_rank decides
    frame = schedule_to_frame(sched).sort_values("dispatch_rank", ascending=False, kind="stable")
    from_frame = as_plan(pd.DataFrame(frame))
    assert from_sched == from_frame
    assert from_sched.group_ids == (0, 0, 1, 1, 2, 2)
    assert [list(mb) for mb in from_sched.minibatches] == [m.tolist() for m in sched.minibatches()]
    assert from_sched.fingerprint(n=2) == from_frame.fingerprint(n=2) != from_sched.fingerprint(n=4)
