"""`VLLMEngine`'s weight path (asp.rollout.vllm_weights) and shutdown on CPU, with stand-ins for what needs CUDA.

vLLM cannot run here, so:

* `StandInWorker` stands in for vLLM's GPU worker: it inherits the real `AspWorkerExtension` (as vLLM's worker
  does through ``worker_extension_cls``) and holds ``model_runner.model``, a `StandInVllmModel` (a real tiny Qwen2
  with vLLM's ``load_weights(pairs)`` contract). Its GPU is a name (``asp_device_uuid``), its device the CPU.
* `StandInLLM` stands in for ``vllm.LLM``: ``collective_rpc`` sends the arguments through pickle (the process
  boundary) to every worker; ``llm_engine.engine_core.shutdown``, ``reset_prefix_cache`` and ``generate`` are
  recorded / canned.
* In the IPC path the CPU stands in for each worker's CUDA device (``staging_devices``), so the staging buffers and
  their torch sharing handles are CPU tensors.

`VLLMEngine.from_llm` wraps the stand-in LLM exactly as ``VLLMEngine.__init__`` wraps a real one.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from asp.control.messages import MinibatchOutput, WeightUpdate, WorkItem
from asp.rollout import SamplingParams
from asp.rollout.vllm import VLLMEngine, VLLMOptions
from asp.rollout.vllm_weights import AspWorkerExtension, BucketedLoader, IpcUnavailable
from asp.rollout.weight_transfer import plan_buckets, tensor_metas
from asp.runtime.generation import GenerationActor
from tests.rollout.conftest import build_tokenizer
from tests.rollout.test_weight_transfer import StandInVllmModel, tiny_qwen


class StandInWorker(AspWorkerExtension):
    """Stand-in for vLLM's GPU worker with the real extension mixed in (see the module docstring)."""

    def __init__(self, gpu: str, seed: int = 7) -> None:
        self.gpu = gpu
        self.model_runner = type("StandInModelRunner", (), {})()
        self.model_runner.model = StandInVllmModel(tiny_qwen(seed))
        self.fail_next_open = False

    def asp_device_uuid(self) -> str:
        return self.gpu

    def _asp_device_index(self) -> int | None:
        return None  # CPU: no device index to put into the handle

    def asp_load_ipc_bucket(self, handles: bytes, rows: list) -> int:
        if self.fail_next_open:
            self.fail_next_open = False
            raise RuntimeError("stand-in: cudaIpcOpenMemHandle failed")
        return super().asp_load_ipc_bucket(handles, rows)

    def weights(self) -> dict[str, torch.Tensor]:
        return self.model_runner.model.module.state_dict()


@dataclass
class StandInCompletion:
    index: int
    token_ids: list[int]
    finish_reason: str = "stop"
    text: str = ""
    logprobs: list | None = None


@dataclass
class StandInRequestOutput:
    prompt_token_ids: list[int]
    outputs: list[StandInCompletion] = field(default_factory=list)


class StandInLLM:
    """Stand-in for ``vllm.LLM`` over `StandInWorker`s (see the module docstring)."""

    def __init__(self, workers: list[StandInWorker]) -> None:
        self.workers = workers
        self.calls: list[tuple[str, tuple]] = []
        self.prefix_resets = 0
        self.shutdowns = 0
        self.llm_engine = type("StandInLLMEngine", (), {})()
        self.llm_engine.engine_core = self
        self.fail_on_call: int | None = None

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append((method, args))
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RuntimeError("stand-in: worker died")
        sent = pickle.loads(pickle.dumps(args))  # what crosses the process boundary
        return [getattr(w, method)(*sent, **(kwargs or {})) for w in self.workers]

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True

    def shutdown(self, timeout=None) -> None:  # as llm.llm_engine.engine_core.shutdown
        self.shutdowns += 1

    def generate(self, prompts, sampling_params, use_tqdm=False):
        return [
            StandInRequestOutput(p["prompt_token_ids"], [StandInCompletion(k, [5, 1]) for k in range(sp.n)])
            for p, sp in zip(prompts, sampling_params, strict=True)
        ]


class StandInSamplingParams:
    """Stand-in for ``vllm.SamplingParams`` (keeps the keyword arguments)."""

    def __init__(self, **kwargs) -> None:
        self.__dict__.update(kwargs)


def cpu_gpus(uuids: list[str]) -> dict[str, torch.device]:
    """``staging_devices`` with the CPU standing in for every worker's CUDA device."""
    return {uuid: torch.device("cpu") for uuid in dict.fromkeys(uuids)}


def _engine(
    transfer: str, workers: list[StandInWorker], bucket_bytes: int = 4096, fallback: bool = False, devices=None
):
    llm = StandInLLM(workers)
    engine = VLLMEngine.from_llm(
        llm,
        VLLMOptions(dtype="auto", seed=0),
        tokenizer=build_tokenizer(),
        sampling_cls=StandInSamplingParams,
        loader=None,
    )
    engine.loader = BucketedLoader(engine._rpc, transfer, bucket_bytes, devices or cpu_gpus, fallback=fallback)
    return engine, llm


def _snapshot(seed: int = 1) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tiny_qwen(seed).state_dict().items()}


def _assert_holds(worker: StandInWorker, state: dict[str, torch.Tensor]) -> None:
    held = worker.weights()
    assert all(torch.equal(held[name], tensor) for name, tensor in state.items())


@pytest.mark.parametrize("transfer", ["rpc", "ipc"])
def test_update_weights_loads_every_worker_bucket_by_bucket(transfer):
    workers = [StandInWorker("gpu-a"), StandInWorker("gpu-b")]  # tensor parallel 2
    engine, llm = _engine(transfer, workers)
    state = _snapshot()
    engine.update_weights(state)
    for worker in workers:
        _assert_holds(worker, state)
    buckets = plan_buckets(tensor_metas(state), 4096)
    method = "asp_load_bucket_bytes" if transfer == "rpc" else "asp_load_ipc_bucket"
    assert [m for m, _ in llm.calls if m == method] == [method] * len(buckets) and len(buckets) > 3
    assert all(len(calls) == len(buckets) for calls in (w.model_runner.model.calls for w in workers))
    assert llm.prefix_resets == 1  # once, after the last bucket


def test_ipc_messages_carry_handles_and_plain_rows_not_tensors():
    engine, llm = _engine("ipc", [StandInWorker("gpu-a")])
    engine.update_weights(_snapshot())
    assert llm.calls[0] == ("asp_device_uuid", ())  # asked once which GPUs to stage on
    assert llm.calls[1] == ("asp_reload_begin", ()) and llm.calls[-1] == ("asp_reload_end", ())
    for method, args in llm.calls[2:-1]:
        handles, rows = args
        assert method == "asp_load_ipc_bucket" and isinstance(handles, bytes)
        assert all(isinstance(r, list) and isinstance(r[0], str) for r in rows)
    engine.update_weights(_snapshot(2))
    assert [m for m, _ in llm.calls].count("asp_device_uuid") == 1


def test_auto_falls_back_to_rpc_when_a_worker_gpu_is_not_visible(caplog):
    def invisible(uuids):
        raise IpcUnavailable("worker GPU(s) ['gpu-a'] are not visible to the engine's process")

    worker = StandInWorker("gpu-a")
    engine, _ = _engine("ipc", [worker], fallback=True, devices=invisible)
    state = _snapshot()
    engine.update_weights(state)
    _assert_holds(worker, state)
    assert engine.loader.transfer == "rpc" and "falling back to rpc" in caplog.text
    strict, _ = _engine("ipc", [StandInWorker("gpu-a")], fallback=False, devices=invisible)
    with pytest.raises(IpcUnavailable, match="not visible"):
        strict.update_weights(state)


def test_a_first_ipc_bucket_that_fails_falls_back_but_later_ipc_errors_are_errors():
    worker = StandInWorker("gpu-a")
    engine, _ = _engine("ipc", [worker], fallback=True)
    worker.fail_next_open = True
    state = _snapshot()
    engine.update_weights(state)  # IPC never worked on this engine: fall back to rpc
    _assert_holds(worker, state)
    assert engine.loader.transfer == "rpc"
    worker2 = StandInWorker("gpu-a")
    engine2, _ = _engine("ipc", [worker2], fallback=True)
    engine2.update_weights(state)
    worker2.fail_next_open = True
    with pytest.raises(RuntimeError, match="cudaIpcOpenMemHandle"):
        engine2.update_weights(_snapshot(3))  # IPC worked before: a real error, not "unavailable"
    assert engine2.loader.transfer == "ipc" and engine2.loader.partial


def test_a_reload_that_fails_part_way_blocks_generation_until_one_succeeds():
    worker = StandInWorker("gpu-a")
    engine, llm = _engine("rpc", [worker])
    params = SamplingParams(n=2, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=0)
    assert len(engine.generate(["w1 w2"], params)[0].samples) == 2
    llm.fail_on_call = 3  # the third bucket's call fails: buckets 1-2 are new, the rest old
    with pytest.raises(RuntimeError, match="worker died"):
        engine.update_weights(_snapshot())
    with pytest.raises(RuntimeError, match="failed part-way"):
        engine.generate(["w1 w2"], params)
    llm.fail_on_call = None
    state = _snapshot(4)
    engine.update_weights(state)
    _assert_holds(worker, state)
    assert len(engine.generate(["w1 w2"], params)[0].samples) == 2


def test_deferred_reload_through_a_generation_actor():
    """The actor loads a newer snapshot before its next minibatch; a failed reload fails that minibatch (no mixed
    policy) and the same snapshot is loaded with the next one."""
    worker = StandInWorker("gpu-a")
    engine, llm = _engine("ipc", [worker])
    actor = GenerationActor(0, 0, lambda: engine, SamplingParams(2, 4, 1.0, 1.0, seed=0))
    item = WorkItem(task_id=0, minibatch_id=0, group_id=0, attempt=0, prompt_ids=[10], prompts=["w1 w2"], seed=5)
    state = _snapshot()
    llm.fail_on_call = 3  # after asp_device_uuid and one bucket
    (failed,) = actor.generate([item], WeightUpdate(1, state))
    assert not isinstance(failed, MinibatchOutput) and "failed part-way" in failed.reason
    assert actor.version == 0
    llm.fail_on_call = None
    (out,) = actor.generate([item], WeightUpdate(1, state))
    assert isinstance(out, MinibatchOutput) and out.policy_version == 1 and out.reload_s > 0
    assert np.array_equal(out.lengths, [2, 2])
    _assert_holds(worker, state)


def test_close_shuts_the_engine_core_down_once_and_refuses_further_use():
    engine, llm = _engine("rpc", [StandInWorker("gpu-a")])
    engine.close()
    assert llm.shutdowns == 1 and engine.llm is None
    engine.close()  # idempotent
    assert llm.shutdowns == 1
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate(["w1"], SamplingParams(n=1, max_new_tokens=2, temperature=1.0, top_p=1.0, seed=0))
    with pytest.raises(RuntimeError, match="closed"):
        engine.update_weights(_snapshot())


def test_from_llm_builds_the_loader_from_the_options():
    engine = VLLMEngine.from_llm(
        StandInLLM([]), VLLMOptions(weight_transfer="auto", weight_bucket_mb=3, dtype="auto", seed=0)
    )
    expected = "ipc" if torch.cuda.is_available() else "rpc"
    assert (engine.loader.transfer, engine.loader.bucket_bytes, engine.loader.fallback) == (expected, 3 << 20, True)
    rpc = VLLMEngine.from_llm(StandInLLM([]), VLLMOptions(weight_transfer="rpc", dtype="auto", seed=0))
    assert (rpc.loader.transfer, rpc.loader.fallback) == ("rpc", False)


def test_the_config_offers_the_engines_transfers_with_the_same_defaults():
    from typing import get_args

    from asp.config import VllmRuntimeParams
    from asp.rollout.weight_transfer import WEIGHT_TRANSFERS

    fields = VllmRuntimeParams.model_fields
    assert get_args(fields["weight_transfer"].annotation) == WEIGHT_TRANSFERS
    cfg, opts = VllmRuntimeParams(), VLLMOptions(dtype="auto", seed=0)
    assert (cfg.weight_transfer, cfg.weight_bucket_mb) == (opts.weight_transfer, opts.weight_bucket_mb)
