"""profile and predict on Ray actors (`asp.runtime.profile_actors`), on the session's local Ray cluster.

The tiny demo policy profiled on 6 prompts x 2 samples (8-token cap, 2-prompt minibatches, one per chunk) by two
engine actors gives the same files (same bytes) as one engine in the test process: a minibatch's seed does not
depend on the actor that runs it; each minibatch's timing names its actor. With stand-in engines (no model, so no
torch in the actors): a two-actor run stopped right after chunk 1 was written resumes without sending any minibatch
a saved chunk holds and ends with the files of one engine; with one of two actors killed mid-run every minibatch
comes back once, from the survivor. The predictor's prompts sharded over two actors
get exactly the in-process predictions. A layout the cluster cannot hold is one clear error before any actor starts.
`dispatch_makespan` (the benchmark's model of the dispatch) on hand-worked cases.
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
RUNTIME = {"ray": {"actor_num_cpus": 0.5, "actor_max_restarts": 0}}


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


def test_two_actors_give_the_samples_of_one_engine(
    tmp_path: Path, demo_policy: Built, one_actor: profile.Paths
) -> None:
    paths = _setup(tmp_path, demo_policy.paths.out_dir)
    metrics = profile.run(_params(2), paths, NullTracker())
    _same_outputs(paths, one_actor)
    timings = pd.read_csv(paths.timings)
    assert list(timings.columns)[-1] == "actor" and set(timings["actor"]) == {0, 1}  # both worked, each named
    assert (timings["wall_s"] > 0).all() and metrics["profile/minibatches"] == N_MINIBATCHES
    assert (pd.read_csv(one_actor.timings)["actor"] == 0).all()  # the in-process engine is actor 0


STANDIN = {"jitter": 0.5, "seconds_per_call": 0.05, "max_length": CAP + 2}  # some responses reach the cap


def _standin_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage's engines (in-process and the actors') are `StandInEngine`s: no model, stand-in lengths."""
    from asp.runtime import EngineSpec, StandInEngine

    monkeypatch.setattr(profile, "profile_engine", lambda *args: StandInEngine(**STANDIN))
    monkeypatch.setattr(profile, "profile_engine_spec", lambda *args: EngineSpec("standin", None, STANDIN))


def test_a_stopped_two_actor_run_resumes_without_regenerating_saved_chunks(
    tmp_path: Path, demo_policy: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in engines: stopped (the driver raises) right after chunk 1 was written, the rerun sends only the
    minibatches no saved chunk holds, and the files are those of one in-process engine, byte for byte."""
    _standin_engines(monkeypatch)
    reference = _setup(tmp_path / "one", demo_policy.paths.out_dir)
    profile.run(_params(1), reference, NullTracker())
    paths = _setup(tmp_path / "two", demo_policy.paths.out_dir)

    def stop_after_chunk_1(name: str) -> None:
        if name == "profile:chunk@1":
            raise KeyboardInterrupt("stopped after chunk 1")

    monkeypatch.setattr(profile, "kill_point", stop_after_chunk_1)
    with pytest.raises(KeyboardInterrupt):
        profile.run(_params(2), paths, NullTracker())
    saved = {int(p.stem.split("_")[1]) for p in paths.work_dir.rglob("chunk_*.parquet")}
    assert 1 in saved and not paths.out_dir.exists()

    sent: list[int] = []
    real = profile_actors.WorkItem

    def recorded(*args: Any) -> Any:
        sent.append(args[1])  # the minibatch id
        return real(*args)

    monkeypatch.setattr(profile, "kill_point", lambda name: None)
    monkeypatch.setattr(profile_actors, "WorkItem", recorded)
    profile.run(_params(2), paths, NullTracker())
    assert sorted(sent) == sorted(set(range(N_MINIBATCHES)) - saved)  # one chunk = one minibatch here
    _same_outputs(paths, reference)
    assert (pd.read_parquet(paths.out_dir / "samples.parquet")["finish_reason"] == "length").any()


def test_sharded_predictions_equal_unsharded(
    tmp_path: Path, trained_predictor: Built, loaded_predictor: tuple
) -> None:
    paths = _paths(tmp_path, trained_predictor)
    overlay = {"predictor": trained_predictor.params.predictor.model_dump(mode="json"), "runtime": RUNTIME}
    params = make_params(overlay | {"predict": {"batch_size": BATCH, "actors": 2}})
    metrics = predict.run(params, paths, NullTracker())
    out = pd.read_parquet(paths.out)

    model, tokenizer, _ = loaded_predictor
    texts = trained_predictor.extra["frames"]["train"]["problem"].tolist()
    unsharded, n_truncated = predict.predict_all(model, tokenizer, texts, BATCH)  # what actors: 1 runs
    assert out["predicted_length"].tolist() == unsharded.tolist()  # exactly: the same batches, padded the same
    assert metrics["predict/truncated_prompts"] == n_truncated > 0


@pytest.mark.parametrize(
    ("overlay", "match"),
    [
        (
            {"profile": {"actors": 64}},
            r"profile\.actors asks for 64 actors x runtime\.ray\.actor_num_cpus 0\.5 = 32 CPUs",
        ),
        (
            {"profile": {"actors": 2}, "runtime": {"ray": {"actor_num_gpus": 1.0}}},
            r"= 2 GPUs but the Ray cluster has 0",
        ),
    ],
)
def test_a_layout_the_cluster_cannot_hold_is_one_clear_error(
    tmp_path: Path, demo_policy: Built, overlay: dict, match: str
) -> None:
    paths = _setup(tmp_path, demo_policy.paths.out_dir)
    with pytest.raises(UserError, match=match):
        profile.run(make_params({"profile": PROFILE} | overlay), paths, NullTracker())
    assert not paths.out_dir.exists()


def test_a_dead_actors_minibatches_go_to_the_survivor(caplog: pytest.LogCaptureFixture) -> None:
    """Two stand-in engine actors (no model); the one that did not deliver first is killed: every minibatch still
    comes back exactly once, with the samples its seed gives on any engine."""
    import ray

    from asp.rollout.base import SamplingParams
    from asp.runtime import EngineSpec, RuntimeConfig, StandInEngine

    options = {"jitter": 0.5, "seconds_per_call": 0.2}
    sampling = SamplingParams(2, 16, temperature=1.0, top_p=1.0, seed=0)
    todo = [(m, [f"w{m} w{i} #{m + i}" for i in range(3)]) for m in range(6)]
    got: dict[int, list[list[int]]] = {}
    config = RuntimeConfig(**RUNTIME, control={"stall_timeout_s": 60.0})
    with profile_actors.profile_runner(config, 2, EngineSpec("standin", None, options), sampling) as runner:
        for m, result, actor in runner.run(todo, seed=7):
            if not got:
                ray.kill(runner.actors[1 - actor], no_restart=True)
            assert m not in got
            got[m] = [r.lengths for r in result.results]
    assert sorted(got) == list(range(6))
    engine = StandInEngine(**options)
    assert got == {m: [r.lengths for r in engine.generate(texts, sampling.with_seed(7 + m))] for m, texts in todo}
    assert "died (" in caplog.text and "sending it again" in caplog.text


def test_dispatch_makespan_gives_each_minibatch_to_the_first_idle_engine() -> None:
    assert profile_actors.dispatch_makespan([3, 1, 1, 1], 2) == (3.0, [3.0, 3.0])  # engine 1 takes 1, 1, 1
    assert profile_actors.dispatch_makespan([1, 2, 3], 1) == (6.0, [6.0])
    assert profile_actors.dispatch_makespan([2, 2, 2, 1], 3) == (3.0, [3.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="engines must be >= 1"):
        profile_actors.dispatch_makespan([1.0], 0)


def test_pool_layout_is_a_count_or_launchs() -> None:
    from asp.runtime import RuntimeConfig

    rt = RuntimeConfig(ray={"generation_units": 3, "actors_per_unit": 4})
    assert profile_actors.pool_size(rt, "runtime") == 12 and profile_actors.pool_size(rt, 5) == 5
    assert profile_actors.pool_config(rt, 5).ray.generation_units == 1


def test_a_failed_engine_call_is_reported_with_its_reason() -> None:
    """The dispatcher reads an actor's `Failure` as the error text to retry on (its `reason`)."""
    from asp.control.messages import Failure
    from asp.runtime.profile_actors import _one_error

    assert (
        _one_error([Failure(task_id=3, attempt=0, gu=0, actor=1, reason="CUDA out of memory")]) == "CUDA out of memory"
    )
