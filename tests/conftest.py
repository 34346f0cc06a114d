"""Shared test setup: offline env, quiet progress bars, MLflow in a temporary SQLite store; ONE local Ray
cluster per pytest process and a tiny random Qwen2 (runtime and trainer tests).

Ray starts once per process (about 5 s, dashboard off) with 4 logical CPUs; every `run_async` call joins it and
kills its own actors on exit. Under pytest-xdist (`make test`: 2 workers) each worker is such a process: session
fixtures run once per worker, in its own temporary directory, and every server takes a free port, so nothing here
assumes one pytest process per machine. `tiny_qwen` builds a random 2-layer Qwen2 with a word-level tokenizer.
`background` starts helper processes and stops them at teardown; `prefect_server` is a Prefect server on a
free 127.0.0.1 port (`start_prefect_server` starts one, e.g. with its web UI on).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from asp.env import set_offline_defaults

set_offline_defaults()
os.environ.setdefault("ASP_PROGRESS", "0")
# One compute thread per process (torch/OpenMP, inherited by every stage subprocess, DVC stage and Ray actor).
# The suite runs two pytest workers on two cores, each starting stage processes and Ray actors: with torch's
# default (a thread per core) they oversubscribe the cores and OpenMP's spinning threads waste them. Measured:
# two concurrent policy + train_predictor runs took 186 s with the default threads, 89 s with one each.
for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")


@pytest.fixture
def bench_module(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Import a script of benchmarks/ by module name, fresh (its folder on sys.path for this test only)."""
    folder = str(Path(__file__).resolve().parents[1] / "benchmarks")

    def load(name: str) -> ModuleType:
        monkeypatch.syspath_prepend(folder)
        monkeypatch.delitem(sys.modules, name, raising=False)
        return importlib.import_module(name)

    return load


@pytest.fixture(scope="session", autouse=True)
def _mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Every test logs to a throwaway SQLite store, never the repo's mlflow.db."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
RAY_CPUS = 4


@pytest.fixture(scope="session")
def ray_cluster():
    """The session's local Ray cluster (started here, bound to 127.0.0.1, shut down at the end)."""
    import ray

    from asp.runtime.run import init_local_ray

    if not ray.is_initialized():
        init_local_ray(num_cpus=RAY_CPUS, log_to_driver=False)
    yield ray
    ray.shutdown()


WORDS = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(45)] + [f"#{i}" for i in range(64)]


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen2ForCausalLM (hidden 32, 2 layers) + word-level tokenizer saved to a temp dir."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = tmp_path_factory.mktemp("tiny_qwen")
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", padding_side="left"
    )
    config = Qwen2Config(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class Background:
    """Processes started in their own process group, output to a log file; `stop` signals the whole group."""

    def __init__(self) -> None:
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, cmd: list[str], *, log: Path, env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen:
        with log.open("w") as out:
            proc = subprocess.Popen(
                cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append((proc, log))
        return proc

    def log(self, proc: subprocess.Popen) -> str:
        return next(log for p, log in self.procs if p is proc).read_text()[-3000:]

    def wait_http(self, url: str, proc: subprocess.Popen, timeout_s: float) -> bytes:
        """GET `url` until it answers 200 (returns the body); fail with `proc`'s log if it exits first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"{proc.args} exited with {proc.returncode} before {url} answered:\n{self.log(proc)}")
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    return resp.read()
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        pytest.fail(f"{url} did not answer within {timeout_s:g} s; log of {proc.args}:\n{self.log(proc)}")

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Send `sig` to the process group `proc` leads, SIGKILL it after `timeout_s`; return the exit code."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(timeout_s)


@pytest.fixture
def background() -> Iterator[Background]:
    """Start helper processes (servers); whatever is still running at teardown is stopped (group-wide)."""
    bg = Background()
    try:
        yield bg
    finally:
        for proc, _ in reversed(bg.procs):
            bg.stop(proc)


def start_prefect_server(
    home: Path, background: Background, **settings: str
) -> tuple[dict[str, str], int, subprocess.Popen]:
    """Start `prefect server start` on a free 127.0.0.1 port with PREFECT_HOME=`home` (analytics off; `settings`
    are further PREFECT_* variables) and wait for /api/health. Returns the client environment, port and process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        PREFECT_HOME=str(home),
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        **settings,
    )
    from asp.cli.ui import PREFECT_SERVER_CMD  # `asp ui prefect`'s server: API requests answered 503 are retried

    cmd = [*PREFECT_SERVER_CMD, "--host", "127.0.0.1", "--port", str(port)]
    proc = background.start(cmd, log=home / "server.log", env=env)
    background.wait_http(f"{env['PREFECT_API_URL']}/health", proc, 180)
    return env, port, proc


@pytest.fixture
def prefect_server(tmp_path_factory: pytest.TempPathFactory, background: Background) -> dict[str, str]:
    """A Prefect server on a free 127.0.0.1 port with its own PREFECT_HOME (analytics and UI off), stopped at
    teardown. Returns the environment (a copy of os.environ) that points clients at it (PREFECT_API_URL)."""
    env, _, _ = start_prefect_server(tmp_path_factory.mktemp("prefect_server"), background, PREFECT_UI_ENABLED="false")
    return env


def prefect_api(env: dict[str, str], path: str, body: dict[str, Any] | None = None) -> Any:
    """GET (no `body`) or POST `path` of the Prefect server at env["PREFECT_API_URL"]; the decoded JSON answer.
    A 503 (the server's SQLite was busy: Prefect marks it retryable and its own client retries it) is retried."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        env["PREFECT_API_URL"] + path, data=data, headers={"content-type": "application/json"}
    )
    for attempt in range(6):
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as err:
            if err.code != 503 or attempt == 5:
                raise
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


# The longest test modules, longest first (module seconds of `pytest --durations=0`, summed over setup, call and
# teardown; refresh when a module grows). `make test` runs modules whole on a worker (`--dist loadscope`) in
# collection order (`--no-loadscope-reorder`): starting with the longest keeps a long module from starting last
# while the other worker sits idle (xdist's own order, most tests first, ran the one-test e2e modules last).
LONGEST_MODULES = (
    "tests/pipeline/test_kill_points.py",
    "tests/e2e/test_three_doors.py",
    "tests/pipeline/test_drift_e2e.py",
    "tests/e2e/test_profile_import_e2e.py",
    "tests/runtime/test_multinode.py",
    "tests/trainers/test_grpo_run.py",
    "tests/e2e/test_stages_demo.py",
    "tests/trainers/test_fsdp.py",
    "tests/orchestration/test_drift_loop.py",
    "tests/test_signals.py",
    "tests/test_cli.py",
    "tests/orchestration/test_cancel.py",
    "tests/pipeline/test_stop_resume.py",
    "tests/test_team_server.py",
    "tests/predictor/test_train.py",
    "tests/runtime/test_runtime.py",
    "tests/demo/test_demo_policy.py",
    "tests/pipeline/test_determinism.py",
    "tests/pipeline/test_reprofile.py",
    "tests/pipeline/test_profile_ray.py",
    "tests/pipeline/test_partial_kill.py",
    "tests/drift/test_real_streams.py",
    "tests/pipeline/test_simulate.py",
    "tests/test_ui_servers.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest modules first (`LONGEST_MODULES`), every other module after them in collection order."""
    rank = {path: i for i, path in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: keeps order within
