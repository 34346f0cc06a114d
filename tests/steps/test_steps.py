"""The shared steps map params to their callee's arguments once: engine options (profile, re-profile, the launch's
actors) and the schedule of a set of predictions (schedule, simulate, launch, re-profile)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from asp.config import Params, deep_merge, validate_params
from asp.predictor.calibration import fit_calibration
from asp.schedule import build_schedule, condition_schedule
from asp.steps.engine import engine_options, engine_spec
from asp.steps.scheduling import schedule_predictions

VLLM = {
    "tensor_parallel_size": 2,
    "gpu_memory_utilization": 0.7,
    "max_model_len": 4096,
    "kv_cache_gib": 1.5,
    "multiprocessing": True,
    "enforce_eager": True,
}


def params(overlay: dict) -> Params:
    return validate_params(deep_merge(Params.defaults().model_dump(mode="json"), overlay), "test params")


def test_engine_options_for_profiling_and_for_the_launch_actors(tmp_path) -> None:
    prof = params({"profile": {"engine": {"num_threads": 3}}}).profile
    assert engine_options(prof.engine, seed=5) == {
        "device": "cpu",
        "dtype": "float32",
        "num_threads": 3,
    }
    prof = params({"profile": {"engine": {"kind": "vllm", "dtype": "bfloat16", "vllm": VLLM}}}).profile
    assert engine_options(prof.engine, seed=5) == {
        **VLLM,
        "dtype": "bfloat16",
        "seed": 5,
        "num_threads": 1,  # vLLM's CPU build in the stage's process decodes on one thread, as an actor's does
    }
    runtime = params({"runtime": {"engine": {"kind": "vllm", "dtype": "bfloat16", "vllm": VLLM}}}).runtime
    spec = engine_spec(runtime, tmp_path)
    vllm = runtime.engine.vllm
    assert (spec.kind, spec.model_path, spec.device) == ("vllm", str(tmp_path), "cpu")
    assert spec.options == {
        **VLLM,
        "dtype": "bfloat16",
        "weight_transfer": vllm.weight_transfer,
        "weight_bucket_mb": vllm.weight_bucket_mb,
        "seed": 0,  # vLLM's engine seed (each request carries its own)
        "num_threads": 1,
    }


@pytest.fixture(scope="module")
def preds() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame({"prompt_id": [f"p{i:03d}" for i in range(96)], "predicted_length": rng.lognormal(5, 0.6, 96)})


def _minibatches(sched) -> list[list[str]]:
    return [mb.tolist() for mb in sched.minibatches()]


@pytest.mark.parametrize("calibrated", [False, True])
def test_schedule_predictions_is_the_scheduler_with_the_schedule_params(preds: pd.DataFrame, calibrated: bool) -> None:
    p = params({"schedule": {"b": 4, "kappa": 1, "k": 3, "iterations": 500}, "common": {"seed": 7}})
    x = preds["predicted_length"].to_numpy()
    cal = fit_calibration(x, 1.3 * x) if calibrated else None
    s = p.schedule
    expected = build_schedule(
        preds["prompt_id"].to_numpy(),
        x,
        b=4,
        kappa=1,
        k=3,
        iterations=500,
        seed=7,
        method=s.method,
        calibration=cal,
        loads=s.loads if calibrated else "raw",
        shuffle=s.shuffle_groups,
    )
    assert _minibatches(schedule_predictions(p, preds, cal, condition="C4")) == _minibatches(expected)
    loads, ids = (s.loads if calibrated else "raw"), preds["prompt_id"].to_numpy()
    for cond in ("C0", "C1", "C2", "C3"):
        other = condition_schedule(ids, x, cond, b=4, kappa=1, k=3, seed=7, calibration=cal, loads=loads)
        assert _minibatches(schedule_predictions(p, preds, cal, cond)) == _minibatches(other), cond
