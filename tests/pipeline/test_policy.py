"""policy stage: the built demo checkpoint loads and matches its record; metrics and the warm-start curve are
sane; `source: path` records a local checkpoint with the same content hash; a bad path fails and writes nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from asp.demo.tokenizer import VOCAB_SIZE
from asp.errors import UserError
from asp.pipeline import policy
from asp.steps.loaders import load_policy_tokenizer, policy_model_path
from asp.steps.paths import rebase
from asp.tracking import NullTracker

from .conftest import TINY_POLICY, Built, make_params, read_metrics

METRIC_KEYS = {
    "policy/warm_start_s",
    "policy/warm_start_steps",
    "policy/final_loss",
    "policy/spearman",
    "policy/mean_reward",
    "policy/mean_length",
    "policy/max_length",
    "policy/truncation_rate",
    "policy/tokens_per_s",
    "policy/seconds",
    "policy/n",
    "policy/checkpoint_mb",
}


def test_built_policy_json_names_a_loadable_checkpoint(demo_policy: Built) -> None:
    out = demo_policy.paths.out_dir
    ref = json.loads((out / "policy.json").read_text())
    model_dir = out / "model"
    assert ref["source"] == "build" and Path(ref["model_path"]) == model_dir == policy_model_path(out)
    assert ref["sha256"] == policy.content_hash(model_dir)  # hash of the files as finally saved
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    d = TINY_POLICY["demo"]
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (d["hidden_size"], d["num_layers"])
    tokenizer = load_policy_tokenizer(out)
    assert len(tokenizer) == model.config.vocab_size == VOCAB_SIZE
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id
    assert sorted(p.name for p in out.iterdir()) == ["model", "policy.json"]  # no temporary leftovers
    tags = demo_policy.tracker.client.get_run(demo_policy.tracker.run_id).data.tags
    assert tags["policy.sha256"] == ref["sha256"] and tags["policy.path"] == str(model_dir)


def test_metrics_are_sane_and_logged(demo_policy: Built) -> None:
    m, ev = demo_policy.metrics, TINY_POLICY["eval"]
    assert set(m) == METRIC_KEYS
    assert read_metrics(demo_policy.paths.metrics) == pytest.approx(m, nan_ok=True)
    assert m["policy/n"] == ev["prompts"] * ev["samples"]
    assert 1 <= m["policy/mean_length"] <= m["policy/max_length"] <= ev["max_new_tokens"]
    assert 0 <= m["policy/truncation_rate"] <= 1 and 0 <= m["policy/mean_reward"] <= 1
    assert math.isnan(m["policy/spearman"]) or -1 <= m["policy/spearman"] <= 1
    assert m["policy/warm_start_s"] > 0 and m["policy/tokens_per_s"] > 0
    files = [f for f in (demo_policy.paths.out_dir / "model").rglob("*") if f.is_file()]
    assert m["policy/checkpoint_mb"] == pytest.approx(sum(f.stat().st_size for f in files) / 2**20)

    client, run_id = demo_policy.tracker.client, demo_policy.tracker.run_id
    curve = client.get_metric_history(run_id, "policy/warm_start_loss")
    steps = TINY_POLICY["demo"]["warm_start_steps"]
    assert sorted(p.step for p in curve) == list(range(steps))
    losses = [p.value for p in sorted(curve, key=lambda p: p.step)]
    assert losses[0] == pytest.approx(math.log(VOCAB_SIZE), abs=0.3)  # a fresh model predicts ~uniformly
    assert losses[-1] == pytest.approx(m["policy/final_loss"]) and losses[-1] < losses[0] - 0.1
    run = client.get_run(run_id).data
    assert run.metrics["policy/n"] == m["policy/n"]
    assert run.params["policy.demo.hidden_size"] == "32" and run.params["policy.source"] == "build"


def test_path_source_records_the_checkpoint_and_its_hash(tmp_path: Path, demo_policy: Built) -> None:
    built = demo_policy.paths.out_dir
    params = make_params({"policy": {"source": "path", "path": str(built / "model")}})
    paths = rebase(policy.Paths(), tmp_path)
    metrics = policy.run(params, paths, NullTracker())
    ref = json.loads((paths.out_dir / "policy.json").read_text())
    assert ref == {
        "model_path": str((built / "model").resolve()),
        "source": "path",
        "sha256": json.loads((built / "policy.json").read_text())["sha256"],  # same files, same hash
    }
    assert metrics == {"policy/checkpoint_mb": pytest.approx(demo_policy.metrics["policy/checkpoint_mb"])}
    assert not (paths.out_dir / "model").exists()  # recorded, not copied


@pytest.mark.parametrize("broken", ["missing", "no_config"])
def test_path_source_rejects_a_non_checkpoint_and_writes_nothing(tmp_path: Path, broken: str) -> None:
    ckpt = tmp_path / "ckpt"
    if broken == "no_config":
        ckpt.mkdir()
        (ckpt / "tokenizer.json").write_text("{}")
    paths = rebase(policy.Paths(), tmp_path / "run")
    expected = "not a directory" if broken == "missing" else "no config.json"
    with pytest.raises(UserError, match=rf"policy\.path = '{ckpt}': {expected}"):
        policy.run(make_params({"policy": {"source": "path", "path": str(ckpt)}}), paths, NullTracker())
    assert not paths.out_dir.exists() and not paths.metrics.exists()
    parent = paths.out_dir.parent  # no temporary directory left behind (and no directory made for it)
    assert not parent.exists() or [p.name for p in parent.iterdir()] == []


@pytest.mark.parametrize(("target", "spearman", "stopped_at"), [(0.0, None, 4), (1.0, None, 8), (0.0, 1.0, 8)])
def test_target_reward_ends_the_warm_start_at_the_first_check_that_reaches_it(
    tmp_path: Path,
    new_tracker,
    capsys: pytest.CaptureFixture[str],
    target: float,
    spearman: float | None,
    stopped_at: int,
) -> None:
    """Checks at steps 4 and 8 (the last): target 0 stops at the first check, an unreachable 1.0 runs every step,
    says so on stderr and records the miss; so does target 0 with a length Spearman of 1.0 that an 8-step policy
    does not reach. The validation reward and Spearman curves are MLflow series."""
    demo = {
        **TINY_POLICY["demo"],
        "target_reward": target,
        "target_spearman": spearman,
        "check_every": 4,
        "check_from": 3,
        "check_problems": 3,
    }
    params = make_params({"policy": {"demo": demo, "eval": TINY_POLICY["eval"]}})
    paths = rebase(policy.Paths(), tmp_path)
    tracker = new_tracker("policy-target")
    m = policy.run(params, paths, tracker)
    assert m["policy/warm_start_steps"] == stopped_at
    assert m["policy/warm_start_checks"] == stopped_at // 4
    reached = stopped_at == 4
    assert m["policy/target_reached"] == float(reached)
    assert 0 <= m["policy/validation_reward"] <= 1
    assert not m["policy/validation_spearman"] >= 1.0  # below 1, or NaN (constant lengths)
    assert ("below policy.demo.target_reward" in capsys.readouterr().err) == (not reached)
    history = tracker.client.get_metric_history(tracker.run_id, "policy/warm_start_validation_reward")
    assert [p.step for p in sorted(history, key=lambda p: p.step)] == list(range(4, stopped_at + 1, 4))
    assert history[-1].value == pytest.approx(m["policy/validation_reward"])
    rho = tracker.client.get_metric_history(tracker.run_id, "policy/warm_start_validation_spearman")
    assert sorted(p.step for p in rho) == [p.step for p in sorted(history, key=lambda p: p.step)]
    assert len(tracker.client.get_metric_history(tracker.run_id, "policy/warm_start_loss")) == stopped_at


@pytest.mark.parametrize(
    ("check", "target_spearman", "expected"),
    [
        ((50, 0.40, 0.95), 0.9, True),
        ((50, 0.39, 0.95), 0.9, False),  # reward short
        ((50, 0.45, 0.60), 0.9, False),  # lengths do not follow the prompts yet
        ((50, 0.45, 0.60), None, True),  # reward alone
        ((50, 0.45, math.nan), 0.9, False),  # constant lengths: no Spearman, never reached
    ],
)
def test_a_check_meets_the_target_only_with_both_reward_and_length_tracking(
    check: tuple[int, float, float], target_spearman: float | None, expected: bool
) -> None:
    assert policy.meets(check, 0.4, target_spearman) is expected
