"""Settings that used to be accepted and ignored, or reported with validator internals (issue 39, item 12), each
refused with one message naming the key and what to do: through `asp params check` (exit 2, no traceback) and
`validate_params`; and a chat prompt without text in a lengths file named as such."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from asp.config import LengthsFileParams, read_yaml, validate_params
from asp.errors import UserError
from asp.io.lengths import parse_records

ROOT = Path(__file__).resolve().parents[1]


def _error(**sections: dict) -> str:
    raw = read_yaml(ROOT / "params.yaml")
    for section, values in sections.items():
        for key, value in values.items():
            target = raw[section]
            *parents, last = key.split(".")
            for part in parents:
                target = target[part]
            target[last] = value
    with pytest.raises(UserError) as err:
        validate_params(raw, "params.yaml")
    return str(err.value)


@pytest.mark.parametrize("key", ["actor_resources", "trainer_resources"])
@pytest.mark.parametrize("amount", [-1, 0])
def test_custom_resource_amount_must_be_positive(key: str, amount: int) -> None:
    text = _error(runtime={f"ray.{key}": {"rollout_node": amount}})
    assert f"'runtime.ray.{key}.rollout_node' = {amount}: Input should be greater than 0" in text, text


def test_token_budget_at_or_above_max_new_tokens_is_refused_when_partial_is_on() -> None:
    text = _error(runtime={"partial.enabled": True, "partial.token_budget": 200, "sampling.max_new_tokens": 160})
    assert "runtime.partial.token_budget = 200 is not below runtime.sampling.max_new_tokens = 160" in text, text
    assert "partial rollouts would do nothing" in text and "runtime.partial.enabled: false" in text
    raw = read_yaml(ROOT / "params.yaml")
    raw["runtime"]["partial"] |= {"enabled": False, "token_budget": 200}  # off: the budget is not used
    validate_params(raw, "params.yaml")


@pytest.mark.parametrize(("value", "says"), [("x", "a valid number"), (-1, "greater than 0")])
def test_bias_reference_error_names_the_key_without_validator_internals(value: object, says: str) -> None:
    text = _error(drift={"bias_reference": value})
    assert f"'drift.bias_reference' = {value!r}: Input should be {says}, or 'auto'." in text, text
    assert "constrained-float" not in text and "literal[" not in text


def test_params_check_exits_2_on_a_negative_resource() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "asp", "params", "check", "--set", "runtime.ray.actor_resources={rollout_node: -1}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "'runtime.ray.actor_resources.rollout_node' = -1" in out.stderr


@pytest.mark.parametrize("message", [{"role": "user"}, {"role": "user", "content": None}])
def test_chat_prompt_without_content_is_named(message: dict) -> None:
    records = [("r.jsonl line 1", {"prompt": [{"role": "system", "content": "Be brief."}, message], "length": 3})]
    with pytest.raises(UserError) as err:
        parse_records(records, LengthsFileParams(path="r.jsonl"), 8)
    text = str(err.value)
    assert text.startswith("r.jsonl line 1: the last user message of 'prompt' has no text in 'content'"), text
    assert "NoneType" not in text


STAGES = (
    "policy, prepare, profile, train_predictor, evaluate, predict, schedule, trainer_alone, simulate, launch, "
    "sim_check"
)


@pytest.mark.parametrize("section", ["retries", "timeout_s"])
def test_a_stage_key_that_names_no_stage_is_refused_by_params_check(section: str) -> None:
    """`orchestration.retries` / `timeout_s` are keyed by stage: a typo (`profil`) would be silently unused."""
    out = subprocess.run(
        [sys.executable, "-m", "asp", "params", "check", "--set", f"orchestration.{section}={{profil: 1}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"orchestration.{section}.profil: no stage is named 'profil'; dvc.yaml defines {STAGES}." in out.stderr


def test_a_stage_key_that_names_no_stage_is_refused_at_load_and_by_a_run_request(tmp_path: Path) -> None:
    from asp.config import check_stage_keys, load_params, pipeline_stages
    from asp.orchestration.request import RunRequest, check_request

    assert ", ".join(pipeline_stages(ROOT / "dvc.yaml")) == STAGES
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    raw = read_yaml(ROOT / "params.yaml")
    raw["orchestration"]["retries"] = {"profile": 1, "launch": 1, "lanch": 2}
    (tmp_path / "params.yaml").write_text(yaml_dump(raw))
    with pytest.raises(UserError, match=r"params\.yaml: orchestration\.retries\.lanch: no stage is named 'lanch'"):
        load_params(tmp_path / "params.yaml")
    with pytest.raises(UserError, match=rf"orchestration\.retries\.lanch: .*defines {STAGES}\. Use one"):
        check_request(RunRequest(), root=tmp_path)
    (tmp_path / "dvc.yaml").write_text("stages:\n  hello:\n    cmd: echo hello\n")
    raw["orchestration"]["retries"] = {"profile": 1, "hello": 2}  # asp's default keys stay allowed in any pipeline
    (tmp_path / "params.yaml").write_text(yaml_dump(raw))
    assert load_params(tmp_path / "params.yaml").orchestration.retries == {"profile": 1, "hello": 2}
    raw["orchestration"]["retries"] = {"lanch": 2}
    (tmp_path / "params.yaml").write_text(yaml_dump(raw))
    with pytest.raises(UserError, match=r"orchestration\.retries\.lanch: .*dvc\.yaml defines hello\. Use one"):
        load_params(tmp_path / "params.yaml")
    (tmp_path / "dvc.yaml").unlink()  # a params file outside a pipeline: nothing to check against
    assert load_params(tmp_path / "params.yaml").orchestration.retries["lanch"] == 2
    good = validate_params(read_yaml(ROOT / "params.yaml"))
    assert check_stage_keys(good, STAGES.split(", "), "params.yaml") is good  # the shipped keys are all stages


def yaml_dump(raw: dict) -> str:
    import yaml

    return yaml.safe_dump(raw, sort_keys=False)
