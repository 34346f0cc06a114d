"""Keys that moved (`asp.config.moved_keys`: the profile stage's engine settings now sit in ``profile.engine``, the
shape ``runtime.engine`` has; the runtime's flat keys in its sections ``sampling``, ``queue``, ``control``, ``ray`` and
``trainer``): a params file, a preset, a `--set` or a Prefect run's overrides that still use an old key are refused
with one message naming the new key (exit 2); `asp params migrate FILE...` rewrites a file into the current shape,
keeping its comments, and the result validates to the same values. In-process through `asp.cli.main`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from asp.config import Params, deep_merge, load_params, migrate_params, moved_keys, read_yaml, validate_params
from asp.errors import UserError
from asp.orchestration.request import RunRequest, check_request
from asp.pipeline.simulate import launch_setting_differences

ROOT = Path(__file__).resolve().parents[1]
OLD_PROFILE = """\
profile:
  source: generate
  engine: vllm                # hf | vllm: the engine that profiles
  n_samples: 4
  device: cuda
  dtype: bfloat16
  num_threads: null           # torch's default
  vllm:
    tensor_parallel_size: 2
    max_model_len: 4096       # prompt + response
"""

# the runtime section as it was before its sections: flat keys, `trainer` a scalar, the ray_* names
OLD_RUNTIME = """\
runtime:
  condition: C4
  trainer: simulated          # grpo | simulated: fixed step time
  iterations: 7
  generation_units: 2
  actors_per_unit: 3          # engines per Generation Unit
  q_max: 32                   # Training Queue depth (prompts)
  # two global batches: generation pauses above it
  global_batch_prompts: 16
  n_samples: 4
  max_new_tokens: 96          # response cap
  max_policy_lag: null
  trainer_step_s: 0.25        # simulated only
  refresh_delay_s: 0.1
  ray_address: auto           # join the running cluster
  ray_connect_timeout_s: 5.0
  stall_timeout_s: 120
  coalesce_below_s: 0.0
"""
SECTIONS = ("sampling", "queue", "control", "ray", "trainer")


def _cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    from asp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return int(exit_info.value.code or 0), out.out, out.err


def _old_params_file(path: Path) -> Path:
    """The repository's params.yaml with its profile section written in the earlier shape."""
    data = read_yaml(ROOT / "params.yaml")
    data["profile"] = deep_merge(data["profile"], yaml.safe_load(OLD_PROFILE)["profile"])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_moved_keys_names_each_old_key_and_migrate_puts_it_in_its_new_place() -> None:
    raw = yaml.safe_load(OLD_PROFILE)
    assert moved_keys(raw) == [
        ("profile.engine", "profile.engine.kind"),
        ("profile.device", "profile.engine.device"),
        ("profile.dtype", "profile.engine.dtype"),
        ("profile.num_threads", "profile.engine.num_threads"),
        ("profile.vllm", "profile.engine.vllm"),
    ]
    assert migrate_params(raw) == moved_keys(yaml.safe_load(OLD_PROFILE))
    assert raw["profile"]["engine"] == {
        "kind": "vllm",
        "device": "cuda",
        "dtype": "bfloat16",
        "num_threads": None,
        "vllm": {"tensor_parallel_size": 2, "max_model_len": 4096},
    }
    assert set(raw["profile"]) == {"source", "engine", "n_samples"}
    assert moved_keys(raw) == [] and migrate_params(raw) == []  # current: nothing to do
    half = {"profile": {"engine": {"kind": "vllm", "device": "cuda"}, "device": "cpu", "dtype": "float16"}}
    assert migrate_params(half) == [
        ("profile.device", "profile.engine.device"),
        ("profile.dtype", "profile.engine.dtype"),
    ]
    assert half["profile"]["engine"] == {"kind": "vllm", "device": "cuda", "dtype": "float16"}  # the new key wins


def test_an_old_params_file_is_refused_naming_the_new_key_and_the_command(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    old = _old_params_file(tmp_path / "params.yaml")
    code, _, err = _cli(capsys, "params", "check", "--params", str(old))
    assert code == 2
    assert f"{old}: profile.engine: this key is now profile.engine.kind" in err, err
    assert f"`asp params migrate {old}`" in err and "(4 more key(s) of profile moved the same way)" in err, err
    code, _, err = _cli(capsys, "params", "check", "--params", str(old), "--set", "schedule.k=3")
    assert code == 2 and f"`asp params migrate {old}` to rewrite it" in err, err  # the file, not the --set text


@pytest.mark.parametrize(("key", "new"), [("profile.engine=vllm", "kind"), ("profile.vllm.max_model_len=64", "vllm")])
def test_an_old_key_in_a_set_is_refused_naming_the_key_to_set(
    capsys: pytest.CaptureFixture, key: str, new: str
) -> None:
    code, _, err = _cli(capsys, "params", "check", "--params", str(ROOT / "params.yaml"), "--set", key)
    old = key.split("=")[0]
    assert code == 2 and f"error: --set {old}: this key is now profile.engine.{new}" in err, err
    assert "set profile.engine." + ("kind" if new == "kind" else "vllm.max_model_len") + " instead" in err, err


def test_migrate_rewrites_an_old_file_keeping_comments_and_values(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    old = _old_params_file(tmp_path / "params.yaml")
    expected = yaml.safe_load(old.read_text())
    expected["profile"] = deep_merge(expected["profile"], {})
    migrate_params(expected)
    preset = tmp_path / "preset.yaml"
    preset.write_text("# my cluster\n" + OLD_PROFILE)

    code, out, _ = _cli(capsys, "params", "migrate", str(old), str(preset))
    assert code == 0
    assert f"{old}: 5 key(s) moved" in out and "  profile.device -> profile.engine.device" in out, out
    assert f"{preset}: 5 key(s) moved" in out, out
    assert yaml.safe_load(old.read_text()) == expected  # the same values in their new places
    migrated = validate_params(read_yaml(old), str(old))
    assert migrated.profile.engine.kind == "vllm" and migrated.profile.engine.vllm.tensor_parallel_size == 2
    assert migrated.model_dump()["runtime"] == Params.defaults().model_dump()["runtime"]
    text = preset.read_text()
    assert text.startswith("# my cluster\n")
    assert "kind: vllm" in text and "# hf | vllm: the engine that profiles" in text  # comments kept
    assert "# prompt + response" in text and "num_threads: null" in text, text
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file, renamed

    before = old.read_bytes()
    code, out, _ = _cli(capsys, "params", "migrate", str(old))
    assert code == 0 and "already in the current shape" in out and old.read_bytes() == before


def _old_runtime_file(path: Path) -> Path:
    """The repository's params.yaml with its runtime section written in the earlier, flat shape."""
    data = read_yaml(ROOT / "params.yaml")
    current = {k: v for k, v in data["runtime"].items() if k not in SECTIONS}
    data["runtime"] = deep_merge(current, yaml.safe_load(OLD_RUNTIME)["runtime"])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_old_runtime_keys_move_into_their_sections() -> None:
    raw = yaml.safe_load(OLD_RUNTIME)
    moved = moved_keys(raw)
    assert moved[0] == ("runtime.trainer", "runtime.trainer.kind")  # the scalar first: the section others join
    assert dict(moved) == {
        "runtime.trainer": "runtime.trainer.kind",
        "runtime.generation_units": "runtime.ray.generation_units",
        "runtime.actors_per_unit": "runtime.ray.actors_per_unit",
        "runtime.q_max": "runtime.queue.q_max",
        "runtime.n_samples": "runtime.sampling.n_samples",
        "runtime.max_new_tokens": "runtime.sampling.max_new_tokens",
        "runtime.max_policy_lag": "runtime.queue.max_policy_lag",
        "runtime.trainer_step_s": "runtime.trainer.step_s",
        "runtime.refresh_delay_s": "runtime.trainer.refresh_delay_s",
        "runtime.ray_address": "runtime.ray.address",
        "runtime.ray_connect_timeout_s": "runtime.ray.connect_timeout_s",
        "runtime.stall_timeout_s": "runtime.control.stall_timeout_s",
        "runtime.coalesce_below_s": "runtime.queue.coalesce_below_s",
    }
    assert migrate_params(raw) == moved
    assert raw["runtime"] == {
        "condition": "C4",
        "trainer": {"kind": "simulated", "step_s": 0.25, "refresh_delay_s": 0.1},
        "iterations": 7,
        "ray": {"generation_units": 2, "actors_per_unit": 3, "address": "auto", "connect_timeout_s": 5.0},
        "queue": {"q_max": 32, "max_policy_lag": None, "coalesce_below_s": 0.0},
        "global_batch_prompts": 16,
        "sampling": {"n_samples": 4, "max_new_tokens": 96},
        "control": {"stall_timeout_s": 120},
    }
    assert moved_keys(raw) == [] and migrate_params(raw) == []
    half = {"runtime": {"queue": {"q_max": 64}, "q_max": 32, "trainer": {"kind": "grpo"}, "trainer_step_s": 1.0}}
    assert migrate_params(half) == [
        ("runtime.q_max", "runtime.queue.q_max"),
        ("runtime.trainer_step_s", "runtime.trainer.step_s"),
    ]
    assert half["runtime"] == {"queue": {"q_max": 64}, "trainer": {"kind": "grpo", "step_s": 1.0}}  # the new key wins


def test_an_old_runtime_file_or_preset_is_refused_naming_the_new_key(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    old = _old_runtime_file(tmp_path / "params.yaml")
    code, _, err = _cli(capsys, "params", "check", "--params", str(old))
    assert code == 2 and err.count("error:") == 1, err
    assert f"{old}: runtime.trainer: this key is now runtime.trainer.kind: runtime's settings are grouped in " in err
    assert "(12 more key(s) of runtime moved the same way)" in err and f"`asp params migrate {old}`" in err, err
    preset = tmp_path / "big.yaml"
    preset.write_text("runtime:\n  q_max: 64\n")
    with pytest.raises(UserError) as refused:
        load_params(ROOT / "params.yaml", overlay=preset)
    message = str(refused.value)
    assert message.startswith(f"{ROOT / 'params.yaml'} + {preset}: runtime.q_max: this key is now runtime.queue.q_max")
    assert f"run `asp params migrate {ROOT / 'params.yaml'} {preset}`" in message, message


@pytest.mark.parametrize(
    ("key", "new"),
    [
        ("runtime.q_max=32", "runtime.queue.q_max"),
        ("runtime.trainer=simulated", "runtime.trainer.kind"),
        ("runtime.ray_address=auto", "runtime.ray.address"),
        ("runtime.trainer_step_s=0.1", "runtime.trainer.step_s"),
        ("runtime.actor_resources={rollout: 1}", "runtime.ray.actor_resources"),
    ],
)
def test_an_old_runtime_key_in_a_set_is_refused_naming_the_key_to_set(
    capsys: pytest.CaptureFixture, key: str, new: str
) -> None:
    code, _, err = _cli(capsys, "params", "check", "--params", str(ROOT / "params.yaml"), "--set", key)
    old = key.split("=")[0]
    assert code == 2 and f"error: --set {old}: this key is now {new}: " in err, err
    assert f"To fix it, set {new} instead." in err, err


def test_an_old_runtime_key_in_a_prefect_run_s_overrides_is_refused() -> None:
    request = RunRequest(overrides={"runtime.n_samples": 4}, overrides_from="overrides")
    with pytest.raises(UserError, match=r"^overrides runtime.n_samples: this key is now runtime.sampling.n_samples"):
        check_request(request, root=ROOT)


def test_a_launch_recorded_in_the_old_shape_is_the_same_setting() -> None:
    """`asp simulate` compares the setting with dvc.lock's launch params, recorded before the runtime's sections."""
    raw = read_yaml(ROOT / "params.yaml")
    params = validate_params(raw)
    flat = {k: v for k, v in raw["runtime"].items() if k not in SECTIONS}
    for section in SECTIONS:
        for key, value in raw["runtime"][section].items():
            old = {"address": "ray_address", "connect_timeout_s": "ray_connect_timeout_s", "num_cpus": "ray_num_cpus",
                   "num_gpus": "ray_num_gpus", "step_s": "trainer_step_s"}.get(key, key)  # fmt: skip
            flat[old if section in ("ray", "trainer") else key] = value
    flat["trainer"] = raw["runtime"]["trainer"]["kind"]
    del flat["kind"]
    lock = {"runtime": flat, "schedule": raw["schedule"], "profile": raw["profile"], "common.seed": 0}
    assert launch_setting_differences(params, lock, raw) == []
    lock["runtime"] = {**flat, "q_max": 32}
    assert launch_setting_differences(params, lock, raw) == ["runtime.queue.q_max (launch 32, here 16)"]


def test_migrate_rewrites_an_old_runtime_keeping_comments_and_values(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    old = _old_runtime_file(tmp_path / "params.yaml")
    preset = tmp_path / "preset.yaml"
    preset.write_text("# my cluster\n" + OLD_RUNTIME)
    code, out, _ = _cli(capsys, "params", "migrate", str(old), str(preset))
    assert code == 0 and f"{preset}: 13 key(s) moved" in out, out
    assert "  runtime.ray_address -> runtime.ray.address" in out, out
    migrated = validate_params(read_yaml(old), str(old))
    rt = migrated.runtime
    assert (rt.trainer.kind, rt.trainer.step_s, rt.ray.address, rt.queue.q_max, rt.sampling.n_samples) == (
        "simulated",
        0.25,
        "auto",
        32,
        4,
    )
    assert rt.queue.gu_queue_target == Params.defaults().runtime.queue.gu_queue_target  # the rest: unchanged
    text = preset.read_text()
    assert text.startswith("# my cluster\n") and "trainer:\n    kind: simulated" in text, text
    for comment in (
        "# grpo | simulated: fixed step time",
        "    q_max: 32                 # Training Queue depth (prompts)\n",  # at its column
        "# two global batches: generation pauses above it",  # a comment line after a moved key
        "# join the running",
    ):
        assert comment in text, text
    assert yaml.safe_load(text)["runtime"]["queue"] == {"q_max": 32, "max_policy_lag": None, "coalesce_below_s": 0.0}
    before = preset.read_bytes()
    code, out, _ = _cli(capsys, "params", "migrate", str(preset))
    assert code == 0 and "already in the current shape" in out and preset.read_bytes() == before


def test_the_repository_s_own_files_are_current(capsys: pytest.CaptureFixture) -> None:
    files = [ROOT / "params.yaml", *sorted((ROOT / "configs").glob("*.yaml"))]
    for path in files:
        assert moved_keys(read_yaml(path)) == [], path


def test_migrate_refuses_what_it_cannot_read(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    code, _, err = _cli(capsys, "params", "migrate", str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml: file not found" in err
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    code, _, err = _cli(capsys, "params", "migrate", str(bad))
    assert code == 2 and "list.yaml: expected a mapping" in err
