"""params.yaml validation: the shipped file is complete and equal to the models' defaults; typos, bad values,
booleans for integers and missing sections name the key and value."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from asp.config import Params, deep_merge, load_params, read_yaml, validate_params
from asp.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = read_yaml(ROOT / "params.yaml")


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys |= _leaf_keys(ann, f"{prefix}{name}.")
        else:
            keys.add(prefix + name)
    return keys


def _yaml_leaf_keys(raw: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in raw.items():
        if isinstance(value, dict):
            keys |= _yaml_leaf_keys(value, f"{prefix}{name}.")
        else:
            keys.add(prefix + name)
    return keys


def test_shipped_params_list_every_key_at_its_default() -> None:
    leaves = _leaf_keys(Params)
    # a dict-valued param (orchestration.retries) is one leaf of the models; its entries are keys in the YAML
    shipped = {next((leaf for leaf in leaves if key.startswith(leaf + ".")), key) for key in _yaml_leaf_keys(SHIPPED)}
    assert shipped == leaves  # complete, and nothing the models do not know
    assert load_params(ROOT / "params.yaml") == Params.defaults()  # the models hold the one set of defaults


def test_empty_or_partial_params_name_the_missing_sections(tmp_path: Path) -> None:
    empty = tmp_path / "params.yaml"
    empty.write_text("")
    with pytest.raises(UserError, match="missing section 'common'; missing section 'prepare'.*'runtime'"):
        load_params(empty)
    partial = {k: v for k, v in SHIPPED.items() if k != "schedule"}
    msg = _error_raw(partial)
    assert "missing section 'schedule'" in msg and "missing section 'runtime'" not in msg


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("schedule", "b", True), ("runtime", "iterations", 2.5), ("schedule", "k", "4"), ("prepare", "chat_template", 1)],
)
def test_wrong_types_are_not_coerced(section: str, key: str, value: object) -> None:
    assert f"'{section}.{key}' = {value!r}" in _error({section: {key: value}})


def test_floats_accept_integers() -> None:
    assert validate_params(deep_merge(SHIPPED, {"runtime": {"grpo": {"lr": 1}}})).runtime.grpo.lr == 1.0


def test_rl_choices_match_the_config_literals() -> None:
    from asp.config import GRPOParams
    from asp.rl import ADVANTAGE_SCALES, AGGREGATIONS

    fields = GRPOParams.model_fields
    assert set(get_args(fields["loss_aggregation"].annotation)) == set(AGGREGATIONS)
    assert set(get_args(fields["advantage_scale"].annotation)) == set(ADVANTAGE_SCALES)


def test_runtime_config_is_the_runtime_params_plus_the_seed_and_the_schedule_settings() -> None:
    from asp.config import RuntimeParams
    from asp.runtime import RuntimeConfig

    assert set(RuntimeConfig.model_fields) - set(RuntimeParams.model_fields) == {"seed", "schedule"}
    params = Params.defaults()
    config = RuntimeConfig.from_params(params)
    assert config.seed == params.common.seed and config.iterations == params.runtime.iterations == 200
    assert config.schedule == params.schedule  # history-aware passes (runtime.history) schedule with them
    history = config.control_settings().history
    assert history is not None and history.spec.b == params.schedule.b and history.seed == params.common.seed
    assert RuntimeConfig().control_settings().history is None  # no schedule settings: off
    assert config.model_copy(update={"condition": "C0"}).control_settings().history is None  # C4 only


def test_shipped_params_and_presets_validate() -> None:
    params = load_params(ROOT / "params.yaml")
    assert params.common.seed == 0
    for preset in sorted((ROOT / "configs").glob("*.yaml")):
        load_params(ROOT / "params.yaml", preset)


def _error_raw(raw: dict) -> str:
    with pytest.raises(UserError) as exc:
        validate_params(raw, "params.yaml")
    return str(exc.value)


def _error(overlay: dict) -> str:
    """The message for the shipped params with `overlay` merged in (so only the overlay is wrong)."""
    msg = _error_raw(deep_merge(SHIPPED, overlay))
    assert "missing" not in msg
    return msg


def test_typo_names_key_and_allowed_keys() -> None:
    msg = _error({"prepare": {"profile_prompt": 3}})
    assert "prepare.profile_prompt" in msg and "profile_prompts" in msg


def test_unknown_section() -> None:
    assert "unknown key 'nonsense'" in _error({"nonsense": {}})


def test_demo_dataset_prompt_counts_are_checked() -> None:
    assert "'prepare.demo_prompts' = 0" in _error({"prepare": {"demo_prompts": 0}})


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
    params = Params.defaults()
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
    params = validate_params(deep_merge(SHIPPED, {"runtime": {"grpo": {"lr": 1e-3, "betas": [0.9, 0.95]}}}))
    assert params.runtime.grpo.lr == 1e-3 and params.runtime.grpo.betas == (0.9, 0.95)
    assert params.runtime.grpo.loss_aggregation == "token"  # untouched fields keep the shipped values
    msg = _error({"runtime": {"grpo": {"learning_rate": 1e-3}}})
    assert "runtime.grpo.learning_rate" in msg and "lr" in msg and "loss_aggregation" in msg
    msg = _error({"runtime": {"grpo": {"loss_aggregation": "mean"}}})
    assert "'runtime.grpo.loss_aggregation' = 'mean'" in msg and "'token' or 'sequence'" in msg
    assert "'runtime.trainer.kind' = 'ppo'" in _error({"runtime": {"trainer": {"kind": "ppo"}}})
    assert "'runtime.queue.stale_samples'" in _error({"runtime": {"queue": {"stale_samples": "keep"}}})


# ---- duplicate keys: refused, naming the key and both lines -------------------------------------------------------
def _asp(*args: str, cwd: Path = ROOT) -> tuple[int, str]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "asp", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


def _with_duplicate(text: str, section: str, line: str) -> str:
    """`text` (params.yaml) with `line` added as the last key of `section` (a key that section already has)."""
    lines = text.splitlines()
    start = lines.index(f"{section}:")
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith((" ", "#")))
    return "\n".join([*lines[:end], line, *lines[end:]]) + "\n"


def test_duplicate_key_in_params_is_refused_naming_key_and_both_lines(tmp_path: Path) -> None:
    text = (ROOT / "params.yaml").read_text()
    lines = text.splitlines()
    start = lines.index("schedule:")
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("  b: ")) + 1  # schedule.b
    params = tmp_path / "params.yaml"
    params.write_text(_with_duplicate(text, "schedule", "  b: 64"))
    second = params.read_text().splitlines().index("  b: 64") + 1
    code, err = _asp("params", "check", "-p", str(params))
    assert code == 2 and "Traceback" not in err, err
    assert f"error: {params}: duplicate key 'schedule.b' at lines {first} and {second}" in err.splitlines()[0]


def test_duplicate_section_and_duplicate_key_in_a_preset_are_refused(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text() + "schedule:\n  b: 8\n")
    with pytest.raises(UserError, match=r"duplicate section 'schedule' at lines \d+ and \d+; YAML would silently"):
        read_yaml(params)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs/dup.yaml").write_text("runtime:\n  iterations: 4\n  q_max: 64\n  iterations: 8\n")
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    code, err = _asp("params", "check", "--preset", "dup", cwd=tmp_path)
    assert code == 2 and "configs/dup.yaml: duplicate key 'runtime.iterations' at lines 2 and 4" in err, err


def test_merge_keys_may_be_overridden_and_nested_lists_are_checked(tmp_path: Path) -> None:
    from asp.config import parse_yaml

    assert parse_yaml("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 5\n") == {
        "base": {"x": 1, "y": 2},
        "d": {"x": 5, "y": 2},
    }
    assert parse_yaml("a: 1\n'1': 2\n1: 3\n") == {"a": 1, "1": 2, 1: 3}  # a string and an integer key differ
    path = tmp_path / "x.yaml"
    path.write_text("l:\n  - {y: 1}\n  - y: 2\n    y: 3\n")
    with pytest.raises(UserError, match=r"duplicate key 'l\[1\]\.y' at lines 3 and 4"):
        read_yaml(path)


# ---- where a bad value came from: the file or --set ---------------------------------------------------------------
def test_set_errors_point_at_the_set_value_not_the_file(tmp_path: Path) -> None:
    code, err = _asp("params", "check", "--set", "schedule.b=0")
    assert code == 2
    assert "'schedule.b' = 0 (from --set): Input should be greater than or equal to 1. Fix the --set value" in err
    assert "in the file" not in err
    bad = tmp_path / "params.yaml"
    bad.write_text(re.sub(r"(?m)^  k: 4 ", "  k: 0 ", (ROOT / "params.yaml").read_text(), count=1))
    code, err = _asp("params", "check", "-p", str(bad), "--set", "schedule.kk=1")
    assert code == 2 and "'schedule.k' = 0: " in err and "unknown key 'schedule.kk' (from --set)" in err
    assert "Fix the values in the file and the --set values" in err
    code, err = _asp("params", "check", "-p", str(bad))
    assert code == 2 and "Fix the value in the file" in err and "--set" not in err


# ---- trainer settings that cannot work together: the params refuse them (once make_trainer_factory's checks) ----
@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["runtime.trainer.kind=simulated", "runtime.grpo.world_size=2"],
            "runtime.grpo.world_size = 2 but runtime.trainer.kind = 'simulated' runs on one rank",
        ),
        (["runtime.grpo.cpu_offload=true"], "runtime.grpo.cpu_offload needs a CUDA device (runtime.grpo.device is"),
        (["runtime.grpo.backend=nccl"], "runtime.grpo.backend = 'nccl' needs a CUDA device (runtime.grpo.device is"),
        (["runtime.grpo.reward=nope"], "'runtime.grpo.reward' = 'nope' (from --set): unknown reward 'nope'; choose"),
        (["runtime.grpo.reward=:fn"], "reward ':fn' is not of the form package.module:function"),
    ],
)
def test_params_check_refuses_trainer_settings_that_cannot_work(sets: list[str], message: str) -> None:
    code, err = _asp("params", "check", *(arg for s in sets for arg in ("--set", s)))
    assert code == 2 and message in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err  # one message


def test_trainer_settings_checks_apply_only_where_they_matter() -> None:
    from asp.config import GRPOParams, RuntimeParams

    for knobs in ({"cpu_offload": True}, {"backend": "nccl"}, {"world_size": 2}):
        on_gpu = RuntimeParams(grpo=GRPOParams(device="cuda", **knobs))  # fine on a CUDA device
        assert on_gpu.grpo.device == "cuda"
    # a simulated trainer leaves runtime.grpo unused: only its rank count is refused
    assert (
        RuntimeParams(grpo=GRPOParams(cpu_offload=True, backend="nccl"), trainer={"kind": "simulated"}).trainer.kind
        == "simulated"
    )
    assert GRPOParams(reward="tests.trainers.test_grpo:share_of_w_words").reward.endswith(":share_of_w_words")
    assert GRPOParams(reward="demo_steps").reward == "demo_steps"


def test_the_profile_samples_as_the_launch_unless_it_sets_its_own() -> None:
    """profile.max_new_tokens / temperature / top_p null (the shipped file) or absent take runtime's values: one
    setting, so a changed launch cap changes what the profile measures too; an explicit profile value wins."""
    assert {SHIPPED["profile"][key] for key in ("max_new_tokens", "temperature", "top_p")} == {None}
    shipped = load_params(ROOT / "params.yaml")
    assert (shipped.profile.max_new_tokens, shipped.profile.top_p) == (shipped.runtime.sampling.max_new_tokens, 1.0)
    longer = validate_params(deep_merge(SHIPPED, {"runtime": {"sampling": {"max_new_tokens": 300, "top_p": 0.9}}}))
    assert (longer.profile.max_new_tokens, longer.profile.top_p) == (300, 0.9)
    profile = {key: value for key, value in SHIPPED["profile"].items() if key != "max_new_tokens"}  # absent: same
    assert (
        validate_params({**SHIPPED, "profile": profile, "runtime": longer.runtime.model_dump()}).profile.max_new_tokens
        == 300
    )
    own = validate_params(
        deep_merge(SHIPPED, {"profile": {"max_new_tokens": 64}, "runtime": {"sampling": {"max_new_tokens": 300}}})
    )
    assert (own.profile.max_new_tokens, own.runtime.sampling.max_new_tokens) == (64, 300)
    with pytest.raises(
        UserError, match=r"runtime.sampling.temperature is 0 \(greedy\) and profile.temperature is null"
    ):
        validate_params(deep_merge(SHIPPED, {"runtime": {"sampling": {"temperature": 0}}}))
    greedy = validate_params(
        deep_merge(SHIPPED, {"runtime": {"sampling": {"temperature": 0}}, "profile": {"temperature": 0.7}})
    )
    assert (greedy.runtime.sampling.temperature, greedy.profile.temperature) == (0, 0.7)
