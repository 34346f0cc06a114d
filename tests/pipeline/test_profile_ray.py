"""profile and predict on Ray actors (`asp.runtime.profile_actors`), on the session's local Ray cluster.

The tiny demo policy profiled on 6 prompts x 2 samples (8-token cap, 2-prompt minibatches, one per chunk) by two
engine actors gives the same samples (same bytes) as one engine in the test process: a minibatch's seed does not
depend on the actor that runs it. Each minibatch's timing names its actor. A two-actor run stopped after chunk 1 was
written resumes without sending any minibatch a saved chunk holds, and ends with the uninterrupted run's files.
The predictor's prompts sharded over two actors get exactly the in-process predictions. Bad layouts are one clear
error before any actor starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from asp.errors import UserError
from asp.pipeline import predict, profile
from asp.runtime import profile_actors
from asp.tracking import NullTracker

from .conftest import Built, make_params
from .test_predict import BATCH, _paths
from .test_profile import CAP, MB, N_MINIBATCHES, N_SAMPLES, _setup

pytestmark = pytest.mark.usefixtures("ray_cluster")
PROFILE = {"n_samples": N_SAMPLES, "max_new_tokens": CAP, "minibatch_prompts": MB, "chunk_minibatches": 1}
RUNTIME = {"actor_num_cpus": 0.5, "actor_max_restarts": 0}


def _params(actors: Any) -> Any:
    return make_params({"profile": PROFILE | {"actors": actors}, "runtime": RUNTIME})


@pytest.fixture(scope="module")
def one_actor(tmp_path_factory: pytest.TempPathFactory, demo_policy: Built) -> profile.Paths:
    """The profile stage with one engine in this process (the default)."""
    paths = _setup(tmp_path_factory.mktemp("one_actor"), demo_policy.paths.out_dir)
    profile.run(_params(1), paths, NullTracker())
    return paths


def _same_outputs(paths: profile.Paths, reference: profile.Paths) -> None:
    for name in ("samples.parquet", "prompts.parquet"):
        assert (paths.out_dir / name).read_bytes() == (reference.out_dir / name).read_bytes(), name
    ours, theirs = pd.read_csv(paths.timings), pd.read_csv(reference.timings)
    assert ours["minibatch"].tolist() == list(range(N_MINIBATCHES))
    cols = ["num_prompts", "n", "max_new_tokens", "total_tokens", "max_length", "prompt_tokens"]
    pd.testing.assert_frame_equal(ours[cols], theirs[cols])


def test_two_actors_give_the_samples_of_one(tmp_path: Path, demo_policy: Built, one_actor: profile.Paths) -> None:
    paths = _setup(tmp_path, demo_policy.paths.out_dir)
    metrics = profile.run(_params(2), paths, NullTracker())
    _same_outputs(paths, one_actor)
    timings = pd.read_csv(paths.timings)
    assert list(timings.columns)[-1] == "actor" and set(timings["actor"]) == {0, 1}  # both worked, each named
    assert (pd.read_csv(one_actor.timings)["actor"] == 0).all()  # the in-process engine is actor 0
    assert metrics["profile/minibatches"] == N_MINIBATCHES and (timings["wall_s"] > 0).all()


def test_a_stopped_two_actor_run_resumes_without_regenerating_saved_chunks(
    tmp_path: Path, demo_policy: Built, one_actor: profile.Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _setup(tmp_path, demo_policy.paths.out_dir)

    def stop_after_chunk_1(name: str) -> None:
        if name == "profile:chunk@1":
            raise KeyboardInterrupt("stopped after chunk 1")

    monkeypatch.setattr(profile, "kill_point", stop_after_chunk_1)
    with pytest.raises(KeyboardInterrupt):
        profile.run(_params(2), paths, NullTracker())
    monkeypatch.undo()
    saved = {int(p.stem.split("_")[1]) for p in paths.work_dir.rglob("chunk_*.parquet")}
    assert 1 in saved and not paths.out_dir.exists()

    sent: list[int] = []
    real = profile_actors.WorkItem

    def recorded(*args: Any) -> Any:
        sent.append(args[1])  # the minibatch id
        return real(*args)

    monkeypatch.setattr(profile_actors, "WorkItem", recorded)
    profile.run(_params(2), paths, NullTracker())
    assert sorted(sent) == sorted(set(range(N_MINIBATCHES)) - saved)  # one chunk = one minibatch here
    _same_outputs(paths, one_actor)


def test_sharded_predictions_equal_unsharded(tmp_path: Path, trained_predictor: Built) -> None:
    def run(actors: Any, root: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
        paths = _paths(root, trained_predictor)
        params = make_params(
            {"predictor": trained_predictor.params.predictor.model_dump(mode="json"), "runtime": RUNTIME}
            | {"predict": {"batch_size": BATCH, "actors": actors}}
        )
        metrics = predict.run(params, paths, NullTracker())
        return pd.read_parquet(paths.out), metrics

    one, m1 = run(1, tmp_path / "one")
    two, m2 = run(2, tmp_path / "two")
    pd.testing.assert_frame_equal(one, two, check_exact=True)
    assert m1["predict/truncated_prompts"] == m2["predict/truncated_prompts"] > 0


@pytest.mark.parametrize(
    ("overlay", "match"),
    [
        ({"profile": {"actors": 64}}, r"profile\.actors asks for 64 actors x runtime\.actor_num_cpus 0\.5 = 32 CPUs"),
        ({"profile": {"actors": 2}, "runtime": {"actor_num_gpus": 1.0}}, r"= 2 GPUs but the Ray cluster has 0"),
    ],
)
def test_a_layout_the_cluster_cannot_hold_is_one_clear_error(
    tmp_path: Path, demo_policy: Built, overlay: dict, match: str
) -> None:
    paths = _setup(tmp_path, demo_policy.paths.out_dir)
    with pytest.raises(UserError, match=match):
        profile.run(make_params({"profile": PROFILE} | overlay), paths, NullTracker())
    assert not paths.out_dir.exists()


def test_pool_layout_is_a_count_or_launchs() -> None:
    from asp.runtime import RuntimeConfig

    rt = RuntimeConfig(generation_units=3, actors_per_unit=4)
    assert profile_actors.pool_size(rt, "runtime") == 12 and profile_actors.pool_size(rt, 5) == 5
    assert profile_actors.pool_config(rt, 5).generation_units == 1
