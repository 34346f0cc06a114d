"""profile stage on the tiny demo policy: 4 profiling + 2 held-out prompts x 2 samples, 8-token cap, one
2-prompt minibatch per chunk. Samples, per-prompt stats, timings and metrics agree with each other (the wall-clock
timings in their own CSV, outside the output directory later stages read); a run killed after two chunks resumes
with only the missing minibatches and gives the same files as an uninterrupted run; a damaged (truncated) chunk is
named when the run starts and generated again, the intact ones kept; the progress count starts from the minibatches
the saved chunks hold (never past the total); work directories of other run keys are removed when a run starts, its
own after it succeeded. Hard kills (SIGKILL) at each phase: tests/pipeline/test_kill_points.py."""

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
from asp.pipeline import profile
from asp.steps.engine import profile_engine
from asp.steps.loaders import load_policy_tokenizer, policy_model_path
from asp.steps.paths import rebase
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
        "minibatch", "wall_s", "num_prompts", "n", "max_new_tokens", "total_tokens", "max_length", "prompt_tokens",
        "actor",
    ]  # fmt: skip
    assert (timings["actor"] == 0).all()  # one engine, in this process (profile.actors: 1)
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
    tmp_path: Path, demo_policy: Built, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
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

    data = chunks[1].read_bytes()
    chunks[1].write_bytes(data[: len(data) // 2])  # truncated: named when the run starts and generated again
    calls = _count_generate(monkeypatch)
    metrics = profile.run(PARAMS, paths, NullTracker())
    err = capsys.readouterr().err
    assert f"[profile] {chunks[1]}: damaged (corrupt profiling chunk (" in err, err
    assert "its 1 minibatch(es) are generated again, the 1 intact chunk(s) of the earlier attempt are kept" in err
    assert len(calls) == 2  # chunk 1 again and chunk 2; chunk 0 was reused
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


def test_a_chunk_cut_short_or_of_other_prompts_is_rejected(tmp_path: Path, demo_policy: Built) -> None:
    paths = _setup(tmp_path, demo_policy.paths.out_dir)
    prompts = profile.load_profile_prompts(paths.prompts)
    prof = make_params({"profile": {"n_samples": N_SAMPLES, "minibatch_prompts": MB, "chunk_minibatches": 2}}).profile
    (first, mbs), _ = profile.chunk_layout(len(prompts), prof, tmp_path)  # chunk 0: minibatches 0, 1 (4 prompts)
    rows = [{"prompt_id": f"q{i:03d}", "role": "profile", "sample": j, "length": 3, "finish_reason": "stop"}
            for i in range(4) for j in range(N_SAMPLES)]  # fmt: skip
    timings = [{"minibatch": m, "wall_s": 0.1} for m in mbs]
    (tmp_path / "chunk_00000.timings.json").write_text(json.dumps(timings))
    pd.DataFrame(rows).to_parquet(first)
    assert profile.chunk_problem(first, prompts, mbs, prof) is None
    pd.DataFrame(rows[:5]).to_parquet(first)  # a minibatch short
    assert profile.chunk_problem(first, prompts, mbs, prof) == (
        "holds 5 samples and 2 minibatch timings, not 8 and 2 (cut short?)"
    )
    pd.DataFrame([{**r, "prompt_id": "zz"} for r in rows]).to_parquet(first)
    assert profile.chunk_problem(first, prompts, mbs, prof) == "holds samples of other prompts than its minibatches"
    assert profile.check_chunks(prompts, prof, tmp_path) == [first] and not first.exists()


def test_progress_counts_the_minibatches_saved_chunks_hold(
    tmp_path: Path, demo_policy: Built, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """3 minibatches in chunks of 2: with only the short last chunk saved, the count starts at 1 (not 2, which ended
    at '4/3'), and ends at 3/3."""
    paths = _setup(tmp_path, demo_policy.paths.out_dir)
    prompts = profile.load_profile_prompts(paths.prompts)
    prof = make_params({"profile": {"n_samples": N_SAMPLES, "max_new_tokens": CAP, "minibatch_prompts": MB,
                                    "chunk_minibatches": 2}}).profile  # fmt: skip
    engine = profile_engine(prof, policy_model_path(demo_policy.paths.out_dir), 0)
    work = tmp_path / "work"
    work.mkdir()
    chunks = profile.profile_chunks(engine, prompts, prof, 0, work)
    chunks[0].unlink()  # the first chunk (2 minibatches) is missing, the last (1 minibatch) saved
    monkeypatch.setenv("ASP_PROGRESS", "1")
    capsys.readouterr()
    profile.profile_chunks(engine, prompts, prof, 0, work)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[profile]")]
    assert "(1/3 minibatch) resumed" in lines[0] and "(3/3 minibatch) done" in lines[-1], lines
    assert all(int(n) <= 3 for n in re.findall(r"\((\d+)/3 minibatch\)", "\n".join(lines)))


def test_cap_calls_time_short_minibatches_on_the_first_prompts_after_the_profile() -> None:
    prompts = pd.DataFrame({"prompt": [f"p{i}" for i in range(5)]})  # minibatches of 2: 3 (the last holds one)
    prof = PARAMS.profile.model_copy(update={"timing_caps": [4, 8, 16, 1]})  # 8 and 16 reach the cap 8: skipped
    calls = profile.cap_calls(prompts, prof, seed=100)
    assert [(m, texts, s.max_new_tokens, s.seed) for m, texts, s in calls] == [
        (3, ["p0", "p1"], 4, 103), (4, ["p2", "p3"], 4, 104), (5, ["p0", "p1"], 1, 105), (6, ["p2", "p3"], 1, 106),
    ]  # fmt: skip
    assert all((s.n, s.temperature) == (N_SAMPLES, prof.temperature) for _, _, s in calls)
    one = profile.cap_calls(prompts.iloc[:2], prof, seed=0)  # one profile minibatch: one prompt set per cap
    assert [(m, s.max_new_tokens) for m, _, s in one] == [(1, 4), (2, 1)]
    assert profile.cap_calls(prompts, prof.model_copy(update={"timing_caps": []}), seed=0) == []


def test_capped_calls_are_timed_after_the_profile_and_change_no_sample(tmp_path: Path, demo_policy: Built) -> None:
    plain = _setup(tmp_path / "plain", demo_policy.paths.out_dir)
    profile.run(PARAMS, plain, NullTracker())
    capped = _setup(tmp_path / "capped", demo_policy.paths.out_dir)
    params = make_params({"profile": {**PARAMS.profile.model_dump(), "timing_caps": [3, 5, 8]}})
    metrics = profile.run(params, capped, NullTracker())

    pd.testing.assert_frame_equal(*(pd.read_parquet(p.out_dir / "samples.parquet") for p in (plain, capped)))
    timings = pd.read_csv(capped.timings)
    extra = timings[timings["minibatch"] >= N_MINIBATCHES]
    assert extra["minibatch"].tolist() == [3, 4, 5, 6] and extra["max_new_tokens"].tolist() == [3, 3, 5, 5]
    assert (extra["max_length"] <= extra["max_new_tokens"]).all() and (extra["num_prompts"] == MB).all()
    assert (extra["n"] == N_SAMPLES).all() and (extra["wall_s"] > 0).all()
    assert (timings.loc[timings["minibatch"] < N_MINIBATCHES, "max_new_tokens"] == CAP).all()
    assert metrics["profile/minibatches"] == N_MINIBATCHES and metrics["profile/cap_calls"] == 4


def _partial(max_rows: int | None = 6, budget: int = 3, calls: int = 3, enabled: bool = True):
    return make_params(
        {
            "profile": {**PARAMS.profile.model_dump(), "timing_continuations": calls},
            "runtime": {"partial": {"enabled": enabled, "token_budget": budget, "max_rows": max_rows}},
        }
    )


def test_continuation_plan_cuts_responses_at_the_launch_budget_and_continues_growing_calls() -> None:
    prompts = pd.DataFrame({"prompt": [f"p{i}" for i in range(5)]})  # minibatches of 2: 3 prompt sets
    plan = profile.continuation_plan(_partial(), prompts, first=7)
    assert plan is not None and (plan.budget, plan.limit, plan.targets) == (3, CAP, (2, 3, 6))  # 6 // 3, 6 // 2, 6
    assert len(plan.passes) == profile.PASS_CALLS
    assert [(m, texts) for m, texts, _ in plan.passes[:4]] == [
        (7, ("p0", "p1")), (8, ("p2", "p3")), (9, ("p4",)), (10, ("p0", "p1")),
    ]  # fmt: skip
    assert all((s.n, s.max_new_tokens, s.seed) == (N_SAMPLES, 3, PARAMS.common.seed + m) for m, _, s in plan.passes)
    # max_rows null: a minibatch's rows (profile.minibatch_prompts x n_samples = 4)
    assert profile.continuation_plan(_partial(max_rows=None, calls=2), prompts, 0).targets == (2, 4)
    assert profile.continuation_plan(_partial(calls=1), prompts, 0).targets == (6,)
    for off in (_partial(enabled=False), _partial(calls=0), _partial(budget=CAP)):  # nothing is ever continued
        assert profile.continuation_plan(off, prompts, 0) is None


def test_a_continuation_row_is_one_sample_per_context() -> None:
    row = profile.continuation_row(12, 0.5, contexts=[40, 52, 47], new=[3, 1, 3], budget=3)
    assert row == {
        "minibatch": 12, "wall_s": 0.5, "num_prompts": 3, "n": 1, "max_new_tokens": 3, "total_tokens": 7,
        "max_length": 3, "prompt_tokens": 139, "actor": 0,
    }  # fmt: skip
    assert list(row) == profile.TIMING_COLUMNS


def test_continuation_calls_are_timed_after_the_caps_and_change_no_sample(tmp_path: Path, demo_policy: Built) -> None:
    """Partial rollouts on: responses cut at the budget by first segments (timed like caps) are continued from
    their token ids in calls of growing size (one sample per context, max_new_tokens the budget)."""
    plain = _setup(tmp_path / "plain", demo_policy.paths.out_dir)
    profile.run(PARAMS, plain, NullTracker())
    cont = _setup(tmp_path / "cont", demo_policy.paths.out_dir)
    params = _partial().model_copy(update={"profile": _partial().profile.model_copy(update={"timing_caps": [5]})})
    metrics = profile.run(params, cont, NullTracker())

    pd.testing.assert_frame_equal(*(pd.read_parquet(p.out_dir / "samples.parquet") for p in (plain, cont)))
    timings = pd.read_csv(cont.timings)
    extra = timings[timings["minibatch"] >= N_MINIBATCHES + 2]  # after the profile's 3 and the cap's 2 calls
    continued = extra[extra["n"] == 1]
    assert metrics["profile/cap_calls"] == 2 + len(extra) - len(continued)  # first segments count as caps
    assert metrics["profile/continuation_calls"] == len(continued) >= 1
    assert (extra.loc[extra["n"] == N_SAMPLES, "max_new_tokens"] == 3).all()  # first segments cut at the budget
    assert (continued["max_new_tokens"] == 3).all() and (continued["max_length"] <= 3).all()
    assert (continued["num_prompts"] <= 6).all() and (continued["wall_s"] > 0).all()
    # each context is a prompt plus the 3 tokens its first segment generated
    assert (continued["prompt_tokens"] > 3 * continued["num_prompts"]).all()
    first = N_MINIBATCHES + 2 + profile.PASS_CALLS  # numbered after every planned first segment
    assert continued["minibatch"].tolist() == list(range(first, first + len(continued)))
