"""profile stage on the tiny demo policy: 4 profiling + 2 held-out prompts x 2 samples, 8-token cap, one
2-prompt minibatch per chunk. Samples, per-prompt stats, timings and metrics agree with each other (the wall-clock
timings in their own CSV, outside the output directory later stages read); a run killed after two chunks resumes
with only the missing minibatch and gives the same files as an uninterrupted run; work directories of other run
keys are removed when a run starts, its own after it succeeded."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from asp.demo.task import generate_problems
from asp.errors import UserError
from asp.pipeline import profile, rebase
from asp.pipeline.loaders import load_policy_tokenizer
from asp.tracking import MlflowTracker, NullTracker, end_run

from .conftest import Built, artifact_paths, make_params, write_prompts

N_SAMPLES, CAP, MB = 2, 8, 2
ROLES = {"profile": [0, 1, 2, 3], "heldout": [4, 5]}
N_PROMPTS, N_MINIBATCHES = 6, 3
REAL_GENERATE = profile.timed_generate
PARAMS = make_params(
    {"profile": {"n_samples": N_SAMPLES, "max_new_tokens": CAP, "minibatch_prompts": MB, "chunk_minibatches": 1}}
)


def _setup(root: Path, policy_dir: Path) -> profile.Paths:
    """Chat-formatted demo prompts (as prepare writes them) under `root`; the stage's paths under `root`."""
    tok = load_policy_tokenizer(policy_dir)

    def template(problem: str) -> str:
        return tok.apply_chat_template(
            [{"role": "user", "content": problem}], tokenize=False, add_generation_prompt=True
        )

    paths = rebase(profile.Paths(policy=policy_dir), root)
    write_prompts(paths.prompts, generate_problems(N_PROMPTS, seed=3), ROLES, template)
    return paths


def _count_generate(monkeypatch: pytest.MonkeyPatch, fail_on_call: int | None = None) -> list[int]:
    """Count the stage's engine calls (one per minibatch); raise on call number `fail_on_call` (a kill)."""
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == fail_on_call:
            raise RuntimeError("killed")
        return REAL_GENERATE(*args, **kwargs)

    monkeypatch.setattr(profile, "timed_generate", counted)
    return calls


def test_profile_writes_consistent_samples_stats_timings_and_metrics(
    tmp_path: Path, demo_policy: Built, new_tracker: Callable[[str], MlflowTracker]
) -> None:
    paths = _setup(tmp_path, demo_policy.paths.out_dir)
    tracker = new_tracker("profile")
    metrics = profile.run(PARAMS, paths, tracker)
    end_run(tracker)

    samples = pd.read_parquet(paths.out_dir / "samples.parquet")
    assert len(samples) == N_PROMPTS * N_SAMPLES
    expected_role = {f"q{i:03d}": role for role, idx in ROLES.items() for i in idx}
    assert samples.groupby("prompt_id")["sample"].apply(sorted).to_dict() == {p: [0, 1] for p in expected_role}
    assert (samples["role"] == samples["prompt_id"].map(expected_role)).all()
    assert samples["length"].between(1, CAP).all()
    assert set(samples["finish_reason"]) <= {"stop", "length"}
    assert (samples.loc[samples["finish_reason"] == "length", "length"] == CAP).all()  # only the cap truncates

    stats = pd.read_parquet(paths.out_dir / "prompts.parquet").set_index("prompt_id")
    by_prompt = samples.groupby("prompt_id")
    assert sorted(stats.index) == sorted(expected_role) and (stats["samples"] == N_SAMPLES).all()
    pd.testing.assert_series_equal(stats["mean_length"], by_prompt["length"].mean(), check_names=False)
    pd.testing.assert_series_equal(stats["max_length"], by_prompt["length"].max(), check_names=False)
    truncated = by_prompt["finish_reason"].apply(lambda f: (f == "length").mean())
    pd.testing.assert_series_equal(stats["truncated_frac"], truncated, check_names=False)

    assert sorted(p.name for p in paths.out_dir.iterdir()) == ["prompts.parquet", "samples.parquet"]
    timings = pd.read_csv(paths.timings)
    assert list(timings.columns) == [
        "minibatch", "wall_s", "num_prompts", "n", "max_new_tokens", "total_tokens", "max_length", "prompt_tokens"
    ]  # fmt: skip
    assert timings["minibatch"].tolist() == list(range(N_MINIBATCHES))
    assert (timings["num_prompts"] == MB).all() and (timings["wall_s"] > 0).all()
    assert timings["total_tokens"].sum() == samples["length"].sum()

    assert metrics["profile/prompts"] == N_PROMPTS and metrics["profile/samples"] == N_PROMPTS * N_SAMPLES
    assert metrics["profile/minibatches"] == N_MINIBATCHES
    assert metrics["profile/mean_length"] == pytest.approx(samples["length"].mean())
    assert metrics["profile/truncation_rate"] == pytest.approx((samples["finish_reason"] == "length").mean())
    assert metrics["profile/tokens_per_s"] == pytest.approx(samples["length"].sum() / timings["wall_s"].sum())
    assert json.loads(paths.metrics.read_text()) == pytest.approx(metrics)
    assert not list(paths.work_dir.rglob("chunk_*"))  # finished chunks are removed after a successful run

    run = tracker.client.get_run(tracker.run_id).data
    assert run.params["profile.n_samples"] == str(N_SAMPLES) and run.params["profile.max_new_tokens"] == str(CAP)
    assert run.metrics["profile/samples"] == N_PROMPTS * N_SAMPLES
    assert paths.plot.is_file() and artifact_paths(tracker, "plots") == {f"plots/{paths.plot.name}"}


def test_killed_run_resumes_from_its_chunks(
    tmp_path: Path, demo_policy: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _setup(tmp_path / "resumed", demo_policy.paths.out_dir)
    stale = paths.work_dir / "0123456789abcdef"  # chunks of a run whose inputs changed since: never resumable
    stale.mkdir(parents=True)
    (stale / "chunk_00000.parquet").write_bytes(b"old")
    (paths.work_dir / "notes").mkdir()  # not a run key: not ours to remove
    calls = _count_generate(monkeypatch, fail_on_call=3)
    with pytest.raises(RuntimeError, match="killed"):
        profile.run(PARAMS, paths, NullTracker())
    chunks = sorted(paths.work_dir.rglob("chunk_*.parquet"))
    assert [c.name for c in chunks] == ["chunk_00000.parquet", "chunk_00001.parquet"]  # the stale one is gone
    assert sorted(p.name for p in paths.work_dir.iterdir()) == sorted([chunks[0].parent.name, "notes"])
    assert not paths.out_dir.exists()  # nothing the next stage reads

    chunks[1].write_bytes(b"not parquet")  # a damaged chunk is named, not silently regenerated or used
    with pytest.raises(UserError, match=re.escape(f"{chunks[1]}: corrupt profiling chunk")):
        profile.run(PARAMS, paths, NullTracker())
    chunks[1].unlink()

    calls = _count_generate(monkeypatch)
    metrics = profile.run(PARAMS, paths, NullTracker())
    assert len(calls) == 1  # chunks 0 and 2 (generated by the run that stopped at the bad chunk) were reused
    assert metrics["profile/minibatches"] == N_MINIBATCHES
    assert [p.name for p in paths.work_dir.iterdir()] == ["notes"]  # its own work directory went after success

    fresh = _setup(tmp_path / "fresh", demo_policy.paths.out_dir)
    calls = _count_generate(monkeypatch)
    profile.run(PARAMS, fresh, NullTracker())
    assert len(calls) == N_MINIBATCHES
    for name in ("samples.parquet", "prompts.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(paths.out_dir / name), pd.read_parquet(fresh.out_dir / name))
        assert (paths.out_dir / name).read_bytes() == (fresh.out_dir / name).read_bytes()  # resuming changes nothing
    resumed_t, fresh_t = (pd.read_csv(p.timings) for p in (paths, fresh))
    np.testing.assert_array_equal(resumed_t["total_tokens"], fresh_t["total_tokens"])
