"""Keys that moved (`asp.config.moved_keys`: the profile stage's engine settings now sit in ``profile.engine``, the
shape ``runtime.engine`` has): a params file, a preset or a `--set` that still uses an old key is refused with one
message naming the new key (exit 2); `asp params migrate FILE...` rewrites a file into the current shape, keeping its
comments, and the result validates to the same values. In-process through `asp.cli.main`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from asp.config import Params, deep_merge, migrate_params, moved_keys, read_yaml, validate_params

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
