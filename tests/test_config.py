"""params.yaml validation: the shipped files validate; typos and bad values name the key and value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from asp.config import deep_merge, load_params, validate_params
from asp.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_params_and_presets_validate() -> None:
    params = load_params(ROOT / "params.yaml")
    assert params.common.seed == 0
    for preset in sorted((ROOT / "configs").glob("*.yaml")):
        load_params(ROOT / "params.yaml", preset)


def _error(raw: dict) -> str:
    with pytest.raises(UserError) as exc:
        validate_params(raw, "params.yaml")
    return str(exc.value)


def test_typo_names_key_and_allowed_keys() -> None:
    msg = _error({"prepare": {"profile_prompt": 3}})
    assert "prepare.profile_prompt" in msg and "profile_prompts" in msg


def test_unknown_section() -> None:
    assert "unknown key 'nonsense'" in _error({"nonsense": {}})


def test_bad_value_names_key_value_and_bound() -> None:
    msg = _error({"policy": {"demo": {"num_heads": 0}}})
    assert "'policy.demo.num_heads' = 0" in msg and "greater than or equal to 1" in msg


def test_bad_choice_lists_allowed() -> None:
    msg = _error({"prepare": {"bad_rows": "skip"}})
    assert "'prepare.bad_rows' = 'skip'" in msg and "'error' or 'drop'" in msg


def test_cross_field_profile_subset_must_fit_dataset() -> None:
    msg = _error({"prepare": {"demo_prompts": 100, "profile_prompts": 90, "heldout_prompts": 20}})
    assert "exceeds the dataset size 100" in msg


def test_cross_field_heads_divide_hidden() -> None:
    assert "multiple of num_heads" in _error({"policy": {"demo": {"hidden_size": 30, "num_heads": 4}}})


def test_path_source_needs_path() -> None:
    assert "no path is set" in _error({"policy": {"source": "path"}})


def test_params_are_frozen() -> None:
    params = validate_params({})
    with pytest.raises(ValidationError):
        params.common.seed = 3  # type: ignore[misc]


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text("common: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_params(bad)
    with pytest.raises(UserError, match="file not found"):
        load_params(tmp_path / "missing.yaml")
    bad.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(UserError, match="expected a mapping"):
        load_params(bad)


def test_deep_merge_overlays_leaves_only() -> None:
    assert deep_merge({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": 5}}) == {"a": {"b": 5, "c": 2}, "d": 3}


def test_grpo_section_typed_and_checked() -> None:
    params = validate_params({"runtime": {"trainer": "grpo", "grpo": {"lr": 1e-3, "betas": [0.9, 0.95]}}})
    assert params.runtime.grpo.lr == 1e-3 and params.runtime.grpo.betas == (0.9, 0.95)
    assert params.runtime.grpo.loss_aggregation == "sequence"  # untouched fields keep their defaults
    msg = _error({"runtime": {"grpo": {"learning_rate": 1e-3}}})
    assert "runtime.grpo.learning_rate" in msg and "lr" in msg and "loss_aggregation" in msg
    msg = _error({"runtime": {"grpo": {"loss_aggregation": "mean"}}})
    assert "'runtime.grpo'" in msg and "loss_aggregation = 'mean'" in msg and "token, sequence" in msg
    assert "{" not in msg  # the section's whole dict is not dumped
    assert "'runtime.trainer' = 'ppo'" in _error({"runtime": {"trainer": "ppo"}})
    assert "'runtime.stale_samples'" in _error({"runtime": {"stale_samples": "keep"}})
