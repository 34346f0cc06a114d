"""vLLM request building and output parsing, value by value, with stand-ins for vLLM's output objects.

`FakeRequestOutput`, `StandInCompletion` and `StandInLogprob` mirror the fields `parse_request_outputs` reads from
``vllm.RequestOutput``, ``vllm.CompletionOutput`` and ``vllm.logprobs.Logprob``, so that error paths the real engine
does not produce on demand (an aborted request, log-probs that do not match the tokens) are checked. The engine
itself runs against real vLLM in tests/rollout/test_vllm_real.py. The contract tests below check the request
builders against the installed vLLM's own objects: ``vllm.SamplingParams`` built from our keywords, the
``vllm.LLM`` keyword set (``EngineArgs``), the worker extension against vLLM's worker class (no clashing names, the
attributes it reads), the ``collective_rpc`` / ``reset_prefix_cache`` / engine-core ``shutdown`` entry points
`VLLMEngine` calls, and the weight messages through vLLM's own RPC encoder.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field

import pytest

from asp.errors import UserError
from asp.rollout import SamplingParams, make_engine
from asp.rollout.vllm import (
    WORKER_EXTENSION,
    VLLMEngine,
    VLLMOptions,
    cpu_threads,
    llm_kwargs,
    parse_request_outputs,
    prompt_seeds,
    request_sampling_kwargs,
    sampling_kwargs,
    token_prompts,
)
from asp.rollout.vllm_weights import AspWorkerExtension

PARAMS = SamplingParams(n=4, max_new_tokens=1024, temperature=0.7, top_p=0.95, seed=100)


@dataclass
class StandInLogprob:
    """Stand-in for vllm.logprobs.Logprob."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class StandInCompletion:
    """Stand-in for vllm.outputs.CompletionOutput."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[dict[int, StandInLogprob]] | None = None
    cumulative_logprob: float | None = None
    stop_reason: int | str | None = None


@dataclass
class FakeRequestOutput:
    """Stand-in for vllm.outputs.RequestOutput."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[StandInCompletion] = field(default_factory=list)
    finished: bool = True


def _lp(token: int, value: float, extra: dict[int, float] | None = None) -> dict[int, StandInLogprob]:
    """One position's mapping: the sampled token plus optional top-k extras."""
    out = {token: StandInLogprob(value, rank=1)}
    out.update({t: StandInLogprob(v, rank=2) for t, v in (extra or {}).items()})
    return out


def test_parse_request_outputs_reads_tokens_lengths_reasons_and_sampled_logprobs():
    outputs = [
        FakeRequestOutput(
            "0",
            [10, 11, 12],
            [  # deliberately out of index order: the parser sorts by .index
                StandInCompletion(1, "b", [7, 8, 9], "length", [_lp(7, -0.5), _lp(8, -1.0), _lp(9, -2.0)]),
                StandInCompletion(0, "a", [5, 2], "stop", [_lp(5, -0.25, {6: -3.0}), _lp(2, -0.125, {5: -9.0})]),
            ],
        ),
        FakeRequestOutput("1", [13], [StandInCompletion(0, "", [2], "stop", [_lp(2, 0.0)])]),
    ]
    res = parse_request_outputs(outputs)
    assert [r.prompt_index for r in res] == [0, 1]
    assert [r.prompt_tokens for r in res] == [3, 1]
    a, b = res[0].samples
    assert (a.token_ids, a.text, a.length, a.finish_reason, a.logprobs) == ([5, 2], "a", 2, "stop", [-0.25, -0.125])
    assert (b.token_ids, b.length, b.finish_reason, b.logprobs) == ([7, 8, 9], 3, "length", [-0.5, -1.0, -2.0])
    assert res[1].samples[0].length == 1 and res[1].lengths == [1]


def test_parse_with_own_decoder_replaces_vllm_text():
    out = FakeRequestOutput("0", [1], [StandInCompletion(0, "", [4, 5], "length", None)])
    res = parse_request_outputs([out], decode=lambda ids: "-".join(map(str, ids)))
    assert res[0].samples[0].text == "4-5"


def test_parse_without_logprobs_gives_empty_lists():
    out = FakeRequestOutput("0", [1], [StandInCompletion(0, "x", [4, 5], "length", None)])
    assert parse_request_outputs([out])[0].samples[0].logprobs == []


@pytest.mark.parametrize(
    ("completion", "message"),
    [
        (StandInCompletion(0, "", [4], "abort", [_lp(4, -1.0)]), "finish_reason 'abort'"),
        (StandInCompletion(0, "", [4], None, [_lp(4, -1.0)]), "finish_reason None"),
        (StandInCompletion(0, "", [4, 5], "stop", [_lp(4, -1.0)]), "1 log-prob positions for 2 tokens"),
        (StandInCompletion(0, "", [4], "stop", [_lp(9, -1.0)]), "no log-prob for sampled token 4"),
    ],
)
def test_parse_rejects_inconsistent_outputs(completion, message):
    with pytest.raises(ValueError, match=message):
        parse_request_outputs([FakeRequestOutput("0", [1], [completion])])


def test_sampling_kwargs_translate_the_settings_to_vllm_names():
    kw = sampling_kwargs(PARAMS)
    assert (kw["n"], kw["max_tokens"], kw["temperature"], kw["top_p"], kw["seed"]) == (4, 1024, 0.7, 0.95, 100)
    assert kw["logprobs"] == 0  # the sampled token's log-prob only, no top-k extras
    assert kw["detokenize"] is True and sampling_kwargs(PARAMS, detokenize=False)["detokenize"] is False
    assert sampling_kwargs(PARAMS, logprobs=None)["logprobs"] is None
    # EOS handling (tokenizer + generation_config EOS ids) is vLLM's own: nothing may switch it off or replace it
    assert not {"stop", "stop_token_ids", "ignore_eos", "min_tokens"} & set(kw)
    with pytest.raises(ValueError, match="logprobs"):
        sampling_kwargs(PARAMS, logprobs=-1)


def test_request_sampling_kwargs_seed_each_prompt_and_share_the_rest():
    requests = request_sampling_kwargs(PARAMS, 3, detokenize=False)
    assert [r["seed"] for r in requests] == [100, 104, 108] == prompt_seeds(100, 3, 4)
    assert all(r == {**requests[0], "seed": r["seed"]} for r in requests)
    assert requests[0]["max_tokens"] == 1024 and requests[0]["detokenize"] is False
    assert request_sampling_kwargs(PARAMS, 0) == []


def test_prompt_seeds_give_every_sample_its_own_stream():
    # vLLM seeds sample k of a request with seed + k; prompt i gets seed + i*n, so all 3*4 streams differ.
    seeds = prompt_seeds(100, 3, 4)
    assert seeds == [100, 104, 108]
    assert len({s + k for s in seeds for k in range(4)}) == 12


def test_request_builders_construct_real_vllm_objects(tmp_path):
    """Contract with the installed vLLM: every key is one it accepts, with the meaning we intend."""
    vllm = pytest.importorskip("vllm")
    for seed, kw in zip([100, 104], request_sampling_kwargs(PARAMS, 2, detokenize=False), strict=True):
        sp = vllm.SamplingParams(**kw)
        assert (sp.n, sp.max_tokens, sp.seed, sp.logprobs, sp.detokenize) == (4, 1024, seed, 0, False)
        assert (sp.temperature, sp.top_p) == pytest.approx((0.7, 0.95))
        # temperature / top-p only, like HFEngine: no top-k, no penalties, EOS still ends a sample
        assert sp.top_k in (0, -1) and sp.min_p == 0.0 and sp.repetition_penalty == 1.0 and not sp.ignore_eos
    greedy = vllm.SamplingParams(
        **sampling_kwargs(SamplingParams(n=1, max_new_tokens=8, temperature=0.0, top_p=1.0, seed=0))
    )
    assert greedy.temperature == 0.0 and greedy.max_tokens == 8
    from vllm.engine.arg_utils import EngineArgs

    kw = llm_kwargs(
        tmp_path,
        VLLMOptions(max_model_len=4096, logprobs_mode="raw_logprobs", tensor_parallel_size=2, dtype="auto", seed=0),
    )
    unknown = set(kw) - {f.name for f in dataclasses.fields(EngineArgs)}
    assert not unknown, f"vllm.LLM would reject {unknown}"
    assert set(inspect.signature(vllm.LLM.__init__).parameters) >= {"model", "tokenizer", "seed"}


def test_worker_extension_and_engine_entry_points_match_vllm():
    """Contract: what VLLMEngine and AspWorkerExtension call or read exists in the installed vLLM."""
    vllm = pytest.importorskip("vllm")
    from vllm.v1.engine.core_client import EngineCoreClient
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.worker.gpu_worker import Worker

    # vLLM's init_worker refuses an extension whose attributes the worker class already has
    ours = [a for a in dir(AspWorkerExtension) if not a.startswith("__")]
    assert {"asp_load_bucket_bytes", "asp_load_ipc_bucket", "asp_device_uuid"} <= set(ours)
    assert not [a for a in ours if hasattr(Worker, a)]
    source = inspect.getsource(Worker)  # the attributes the extension reads are set by the worker
    assert "self.device = " in source and "self.model_runner" in source
    assert {"method", "timeout", "args", "kwargs"} <= set(inspect.signature(vllm.LLM.collective_rpc).parameters)
    assert callable(vllm.LLM.reset_prefix_cache) and callable(vllm.LLM.generate)
    assert "self.engine_core = " in inspect.getsource(LLMEngine.__init__)  # close(): llm.llm_engine.engine_core
    assert "timeout" in inspect.signature(EngineCoreClient.shutdown).parameters


def test_weight_messages_pass_vllms_rpc_encoder_without_pickle(monkeypatch):
    """Contract: the collective_rpc arguments of both transports survive vLLM's RPC encoding (msgpack, no pickle).

    The engine core decodes utility calls (``collective_rpc``) without type information, so a tensor argument would
    arrive as a plain [dtype, shape, data] list: that is why buckets travel as bytes (rpc) or IPC handles (ipc).
    """
    pytest.importorskip("vllm")
    import torch

    from asp.rollout.weight_transfer import meta_rows, pack_bucket, plan_buckets, tensor_metas

    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    def through_vllm(args):  # what EngineCoreProc's input thread hands to collective_rpc
        return MsgpackDecoder().decode(MsgpackEncoder().encode(args))

    state = {"a.weight": torch.randn(4, 3), "b.bias": torch.arange(5, dtype=torch.bfloat16)}
    (bucket,) = plan_buckets(tensor_metas(state), 1 << 20)
    data = pack_bucket(state, bucket, torch.empty(bucket.nbytes, dtype=torch.uint8)).numpy().tobytes()
    for args in ((b"pickled-handles", meta_rows(bucket)), (data, meta_rows(bucket))):
        sent, rows = through_vllm(args)
        assert sent == args[0] and rows == args[1]
    (pairs,) = through_vllm(([("a.weight", state["a.weight"])],))
    assert not isinstance(pairs[0][1], torch.Tensor)  # a raw tensor does not survive: never send one


def test_llm_kwargs_builds_engine_arguments(tmp_path):
    options = VLLMOptions(
        tensor_parallel_size=2, gpu_memory_utilization=0.8, dtype="bfloat16", max_model_len=4096, seed=0
    )
    kw = llm_kwargs(tmp_path, options)
    assert kw["model"] == kw["tokenizer"] == str(tmp_path)
    assert (kw["tensor_parallel_size"], kw["gpu_memory_utilization"], kw["dtype"]) == (2, 0.8, "bfloat16")
    assert kw["max_model_len"] == 4096 and kw["logprobs_mode"] == "processed_logprobs"
    assert kw["worker_extension_cls"] == WORKER_EXTENSION and kw["trust_remote_code"] is False
    assert (kw["seed"], kw["enforce_eager"]) == (0, False)
    assert kw["distributed_executor_backend"] == "mp"  # tp ranks as local processes, also in a placement group
    assert "distributed_executor_backend" not in llm_kwargs(tmp_path, VLLMOptions(dtype="auto", seed=0))
    assert "max_model_len" not in llm_kwargs(
        tmp_path, VLLMOptions(dtype="auto", seed=0)
    )  # None: the model's own context length
    raw = llm_kwargs(tmp_path, VLLMOptions(seed=3, logprobs_mode="raw_logprobs", enforce_eager=True, dtype="auto"))
    assert (raw["seed"], raw["logprobs_mode"], raw["enforce_eager"]) == (3, "raw_logprobs", True)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"dtype": "int8"}, "dtype"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"logprobs_mode": "raw_logits"}, "logprobs_mode"),
        ({"weight_transfer": "nccl"}, "weight_transfer"),
        ({"weight_bucket_mb": 0}, "weight_bucket_mb"),
    ],
)
def test_vllm_options_are_checked_before_vllm_is_imported(tiny_model, bad, match):
    with pytest.raises(ValueError, match=match):
        VLLMOptions(**{"dtype": "auto", "seed": 0, **bad})
    with pytest.raises(ValueError, match=match):
        VLLMEngine(tiny_model, **{"dtype": "auto", "seed": 0, **bad})


def test_make_engine_takes_exactly_the_vllm_options(tiny_model):
    with pytest.raises(UserError, match=r"does not take option\(s\) \['device'\]") as err:
        make_engine("vllm", tiny_model, device="cpu")
    assert all(name in str(err.value) for name in VLLMOptions.model_fields)


def test_worker_extension_path_points_at_the_class():
    module, name = WORKER_EXTENSION.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is AspWorkerExtension


def test_worker_extension_feeds_bucket_bytes_to_model_load_weights():
    import torch

    from asp.rollout.weight_transfer import meta_rows, pack_bucket, plan_buckets, tensor_metas

    class StandInModel:  # stand-in for a vLLM model: records what load_weights was given
        loaded: list = []

        def load_weights(self, weights):
            self.loaded = [(name, t.clone()) for name, t in weights]

    class StandInWorker(AspWorkerExtension):  # stand-in for vLLM's GPU worker with the extension mixed in
        def __init__(self):
            self.model_runner = type("Runner", (), {"model": StandInModel()})()

    state = {"a": torch.arange(3.0), "b": torch.ones(2, 2, dtype=torch.float16)}
    (bucket,) = plan_buckets(tensor_metas(state), 1 << 20)
    data = pack_bucket(state, bucket, torch.empty(bucket.nbytes, dtype=torch.uint8)).numpy().tobytes()
    worker = StandInWorker()
    assert worker.asp_load_bucket_bytes(data, meta_rows(bucket)) == 2
    loaded = dict(worker.model_runner.model.loaded)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_token_prompts():
    assert token_prompts([[1, 2], [3]]) == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]


def test_vllm_engine_without_vllm_is_a_user_error(tiny_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # where vLLM is not installed, `import vllm` raises ImportError
    with pytest.raises(UserError, match="vLLM is not installed"):
        VLLMEngine(tiny_model, dtype="auto", seed=0)


def test_the_engine_options_are_the_params_model():
    """One model: `VLLMOptions` is `runtime.engine.vllm`'s (`VllmRuntimeParams`) plus dtype, seed and logprobs_mode,
    with the params' checks (max_model_len >= 16, as `asp params check` says), and the options the pipeline builds
    from params are its fields."""
    from asp.config import EngineParams, RuntimeEngineParams, VllmParams, VllmRuntimeParams
    from asp.steps.engine import engine_options

    assert issubclass(VLLMOptions, VllmRuntimeParams)
    assert set(VLLMOptions.model_fields) - set(VllmRuntimeParams.model_fields) == {
        "dtype",
        "seed",
        "logprobs_mode",
        "num_threads",
    }
    with pytest.raises(ValueError, match="max_model_len"):
        VLLMOptions(max_model_len=8, dtype="auto", seed=0)
    runtime = VllmRuntimeParams(max_model_len=512, kv_cache_gib=1.5, weight_bucket_mb=7)
    opts = engine_options(RuntimeEngineParams(kind="vllm", dtype="float32", num_threads=None, vllm=runtime), seed=4)
    assert set(opts) == set(VLLMOptions.model_fields) - {"logprobs_mode"}  # the pipeline keeps the default mode
    assert VLLMOptions(**opts) == VLLMOptions(**runtime.model_dump(), dtype="float32", seed=4, num_threads=None)
    profile = engine_options(
        EngineParams(kind="vllm", dtype="bfloat16", vllm=VllmParams(tensor_parallel_size=2)), seed=0
    )
    assert VLLMOptions(**profile).tensor_parallel_size == 2 and "weight_transfer" not in profile


def test_cpu_threads_apply_to_an_in_process_engine_on_a_cpu_only():
    """vLLM's CPU build binds no threads with its engine core in the caller's process (it decodes on torch's pool:
    every core in a plain process, OMP_NUM_THREADS=1 in a fractional-CPU Ray actor), so the engine sets
    ``num_threads`` itself there; on a GPU or with the core in its own process the setting is not used."""
    opts = VLLMOptions(dtype="float32", seed=0, num_threads=1)
    assert cpu_threads(opts, cuda=False) == 1
    assert cpu_threads(opts.model_copy(update={"multiprocessing": False}), cuda=False) == 1
    assert cpu_threads(opts.model_copy(update={"multiprocessing": True}), cuda=False) is None
    assert cpu_threads(opts, cuda=True) is None
    assert cpu_threads(VLLMOptions(dtype="float32", seed=0), cuda=False) is None
    with pytest.raises(ValueError, match="num_threads"):
        VLLMOptions(dtype="float32", seed=0, num_threads=0)
