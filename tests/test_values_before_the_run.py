"""Values that used to pass `asp params check` and fail minutes later in a stage, each refused before the run with
one message naming the key (exit 2, no traceback, in seconds): infinite or NaN floats (`runtime.history`'s
prior_samples / drift_per_version, as a `--set` and in the file), a vLLM KV cache larger than its device (this
machine's RAM for vLLM's CPU build), `drift.action: refit_from_run` without `runtime.history`, and a `policy.path`
that is no checkpoint here (refused by `check_request`, what `asp repro` and a Prefect run check before DVC starts;
a note from `asp params check`, since the GPU preset's path is a placeholder). In-process through `asp.cli.main`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from asp.config import read_yaml, validate_params
from asp.errors import UserError
from asp.orchestration.request import RunRequest, check_request

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _check(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """`asp params check ARGS`: exit code, stdout, stderr; it must answer within 5 s."""
    from asp.cli import main

    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        main(["params", "check", *args])
    assert time.perf_counter() - start < 5.0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return int(exit_info.value.code or 0), out.out, out.err


@pytest.mark.parametrize("key", ["runtime.history.prior_samples", "runtime.history.drift_per_version"])
@pytest.mark.parametrize("value", [".inf", ".nan"])
def test_a_float_that_is_not_finite_is_refused_naming_the_set(
    capsys: pytest.CaptureFixture, key: str, value: str
) -> None:
    code, _, err = _check(capsys, "--set", f"{key}={value}")
    assert code == 2 and err.count("error:") == 1
    assert f"'{key}' = " in err and "(from --set): Input should be a finite number" in err
    assert err.rstrip().endswith("Fix the --set value and run again.")  # the --set is blamed, not params.yaml
    with pytest.raises(UserError, match=r"\(from --set\): Input should be a finite number"):
        check_request(RunRequest(overrides={key: float(value.replace(".", ""))}))  # before DVC starts


def test_a_float_that_is_not_finite_in_the_file_names_the_file() -> None:
    raw = read_yaml(ROOT / "params.yaml")
    raw["runtime"]["history"]["prior_samples"] = float("inf")
    with pytest.raises(UserError, match=r"'runtime.history.prior_samples' = inf: .*finite.*Fix the value in the file"):
        validate_params(raw, "params.yaml")


def test_a_kv_cache_larger_than_the_machine_is_refused(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _check(capsys, "--preset", "demo-vllm")
    assert code == 0 and "vLLM KV cache 0.25 GiB: " in out  # the memory line counts the KV cache asked for
    code, _, err = _check(capsys, "--preset", "demo-vllm", "--set", "runtime.engine.vllm.kv_cache_gib=10000")
    assert code == 2 and err.count("error:") == 1
    assert "a KV cache of 10000 GiB (runtime.engine.vllm.kv_cache_gib)" in err and "lower kv_cache_gib" in err
    code, _, err = _check(capsys, "--preset", "demo-vllm", "--set", "profile.engine.vllm.kv_cache_gib=10000")
    assert code == 2 and "profile.engine.vllm.kv_cache_gib = 10000 GiB is not below this machine's memory" in err
    sets = ["--set", "runtime.trainer.kind=simulated", "--set", "runtime.engine.vllm.kv_cache_gib=10000"]
    assert _check(capsys, "--preset", "demo-vllm", *sets)[0] == 2  # checked whichever trainer runs


def test_a_kv_cache_larger_than_the_gpu_is_refused(capsys: pytest.CaptureFixture) -> None:
    code, _, err = _check(capsys, "--preset", "gpu-cluster", "--set", "runtime.engine.vllm.kv_cache_gib=100")
    assert code == 2 and "needs 117.2 GiB of the device's 80.0 GiB. To fit: lower kv_cache_gib to 62.8 GiB" in err


def test_refit_from_run_without_history_is_refused(capsys: pytest.CaptureFixture) -> None:
    sets = ["--set", "drift.action=refit_from_run", "--set", "runtime.history.enabled=false"]
    code, _, err = _check(capsys, *sets)
    assert code == 2 and err.count("error:") == 1
    assert "drift.action = 'refit_from_run'" in err and "runtime.history.enabled is false" in err
    assert "(from --set)" in err and "Fix the --set value" in err
    assert _check(capsys, *sets, "--set", "drift.enabled=false")[0] == 0  # no drift watch: nothing to refit


def test_a_policy_path_that_is_no_checkpoint_is_refused_before_the_policy_stage(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    sets = {"policy.source": "path", "policy.path": str(tmp_path / "nowhere")}
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"policy.path = '.*nowhere': no such directory on this machine"):
        check_request(RunRequest(preset="demo-vllm", overrides=sets))
    assert time.perf_counter() - start < 5.0
    (tmp_path / "nowhere").mkdir()
    with pytest.raises(UserError, match="no config.json there"):
        check_request(RunRequest(preset="demo-vllm", overrides=sets))
    check_request(RunRequest(("schedule",), preset="demo-vllm", overrides=sets))  # the policy stage does not run
    code, out, _ = _check(capsys, "--preset", "gpu-cluster")  # the shipped preset's placeholder path: a note
    assert code == 0 and "note: policy.path = '/models/Qwen3-8B': no such directory" in out
