"""Bucketed weight transfer (asp.rollout.weight_transfer) on CPU.

vLLM's model cannot run here, so `StandInVllmModel` stands in for it: a real tiny Qwen2 (transformers) with a
``load_weights(pairs)`` that, like vLLM's, takes (Hugging Face name, tensor) pairs and copies them into the
parameters. Loading a snapshot bucket by bucket through packed buffers must give exactly the weights that
``load_state_dict`` gives.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from asp.rollout.weight_transfer import (
    ALIGN_BYTES,
    Bucket,
    TensorMeta,
    meta_rows,
    metas_from_rows,
    open_shared,
    pack_bucket,
    plan_buckets,
    plan_transfer,
    share_buffer,
    tensor_metas,
    unpack_bucket,
)


def load_buckets(state: dict[str, torch.Tensor], buckets: list[Bucket], load) -> int:
    """Pack each bucket into one buffer, unpack it and call `load` on its (name, tensor) pairs; returns tensors:
    the whole protocol in one process (what sender and receiver do on either side of a transport)."""
    buffer = torch.empty(max((b.nbytes for b in buckets), default=0), dtype=torch.uint8)
    count = 0
    for bucket in buckets:
        load(unpack_bucket(pack_bucket(state, bucket, buffer), bucket))
        count += len(bucket.tensors)
    return count


def tiny_qwen(seed: int, dtype: torch.dtype = torch.float32) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).to(dtype)


class StandInVllmModel:
    """Stand-in for a vLLM model: a real torch module plus vLLM's ``load_weights(iterable of (name, tensor))``."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.calls: list[list[str]] = []

    def load_weights(self, weights):
        params = dict(self.module.named_parameters())
        names = []
        with torch.no_grad():
            for name, tensor in weights:
                params[name].copy_(tensor)
                names.append(name)
        self.calls.append(names)
        return set(names)


def _meta(name: str, nbytes: int) -> TensorMeta:
    return TensorMeta(name, "uint8", (nbytes,), nbytes)


def test_plan_buckets_hand_worked_case():
    # sizes 100, 300, 50, 1000, 10 with a 512-byte budget and 64-byte alignment:
    # a@0..100, b@128..428, c@448..498 fit; d (1000) exceeds the budget and travels alone; e starts a new bucket.
    metas = [_meta(n, b) for n, b in zip("abcde", [100, 300, 50, 1000, 10], strict=True)]
    buckets = plan_buckets(metas, 512, align=64)
    assert [[m.name for m in b.tensors] for b in buckets] == [["a", "b", "c"], ["d"], ["e"]]
    assert [[m.offset for m in b.tensors] for b in buckets] == [[0, 128, 448], [0], [0]]
    assert [b.nbytes for b in buckets] == [498, 1000, 10]


@pytest.mark.parametrize("seed", range(5))
def test_plan_buckets_keeps_every_tensor_once_in_order_within_the_budget(seed):
    rng = random.Random(seed)
    metas = [_meta(f"t{i}", rng.choice([0, 1, 7, 255, 256, 1000, 5000])) for i in range(60)]
    budget = rng.choice([1, 300, 4096, 10**6])
    buckets = plan_buckets(metas, budget)
    flat = [m for b in buckets for m in b.tensors]
    assert [m.name for m in flat] == [m.name for m in metas]
    for bucket in buckets:
        assert bucket.nbytes <= budget or len(bucket.tensors) == 1  # only a lone tensor may exceed the budget
        assert all(m.offset % ALIGN_BYTES == 0 for m in bucket.tensors)
        ends = [m.offset + m.nbytes for m in bucket.tensors]
        assert all(end <= nxt.offset for end, nxt in zip(ends, bucket.tensors[1:], strict=False))  # no overlap
        assert bucket.nbytes == ends[-1]


def test_plan_buckets_rejects_bad_input():
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets([_meta("a", 1)], 0)
    with pytest.raises(ValueError, match="'a' appears twice"):
        plan_buckets([_meta("a", 1), _meta("a", 2)], 10)
    assert plan_buckets([], 10) == []


@pytest.mark.parametrize(
    ("setting", "cuda", "expected"),
    [("auto", True, "ipc"), ("auto", False, "rpc"), ("ipc", True, "ipc"), ("rpc", True, "rpc"), ("rpc", False, "rpc")],
)
def test_plan_transfer(setting, cuda, expected):
    assert plan_transfer(setting, cuda=cuda) == expected


def test_plan_transfer_rejects_ipc_without_cuda_and_unknown_settings():
    with pytest.raises(ValueError, match="needs CUDA"):
        plan_transfer("ipc", cuda=False)
    with pytest.raises(ValueError, match="weight_transfer must be one of"):
        plan_transfer("nccl", cuda=True)


def test_meta_rows_round_trip_as_plain_lists():
    bucket = plan_buckets(tensor_metas(tiny_qwen(0).state_dict()), 4096)[0]
    rows = meta_rows(bucket)
    assert all(isinstance(r, list) and isinstance(r[2], list) for r in rows)
    assert metas_from_rows(rows) == bucket


@pytest.mark.parametrize("budget", [1, 4096, 1 << 30])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loading_bucket_by_bucket_equals_load_state_dict(budget, dtype):
    source = tiny_qwen(1, dtype)
    state = {k: v.detach().clone() for k, v in source.state_dict().items()}
    direct, bucketed = tiny_qwen(2, dtype), tiny_qwen(2, dtype)
    direct.load_state_dict(state)
    target = StandInVllmModel(bucketed)
    buckets = plan_buckets(tensor_metas(state), budget)
    assert load_buckets(state, buckets, target.load_weights) == len(state)
    for name, tensor in direct.state_dict().items():
        assert torch.equal(bucketed.state_dict()[name], tensor), name
    assert len(target.calls) == len(buckets)  # one load_weights call per bucket
    if budget == 1:
        assert len(buckets) == len(state)  # every tensor alone
    if budget == 1 << 30:
        assert len(buckets) == 1


def test_the_buffer_a_reload_needs_is_one_bucket():
    state = tiny_qwen(0).state_dict()
    largest = max(t.numel() * t.element_size() for t in state.values())
    buckets = plan_buckets(tensor_metas(state), 8192)
    assert len(buckets) > 3
    assert max(b.nbytes for b in buckets) <= max(8192, largest)
    assert sum(b.nbytes for b in buckets) >= sum(t.numel() * t.element_size() for t in state.values())


def test_unpack_gives_views_of_the_buffer_and_pack_checks_the_description():
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "s": torch.tensor(5, dtype=torch.int64)}
    (bucket,) = plan_buckets(tensor_metas(state), 1 << 20)
    buffer = torch.zeros(bucket.nbytes, dtype=torch.uint8)
    pairs = dict(unpack_bucket(pack_bucket(state, bucket, buffer), bucket))
    assert torch.equal(pairs["w"], state["w"]) and pairs["s"].shape == () and int(pairs["s"]) == 5
    buffer.zero_()
    assert float(pairs["w"].sum()) == 0.0  # a view, not a copy
    with pytest.raises(ValueError, match="smaller than the bucket"):
        pack_bucket(state, bucket, torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="does not match"):
        pack_bucket({**state, "w": state["w"].double()}, bucket, buffer)
    with pytest.raises(ValueError, match="not a torch dtype"):
        unpack_bucket(buffer, Bucket((TensorMeta("x", "tensor", (1,), 1),), 1))


def test_a_shared_buffer_reopens_on_the_same_memory():
    buffer = torch.zeros(16, dtype=torch.uint8)
    reopened = open_shared(share_buffer(buffer))
    buffer[3] = 7
    assert int(reopened[3]) == 7


def test_open_shared_puts_the_receivers_device_index_into_a_cuda_handle():
    seen = {}

    def rebuild_stand_in(tensor_cls, size, storage_device, handle):  # stand-in for torch's rebuild_cuda_tensor
        seen["device"] = storage_device
        return handle

    assert open_shared((rebuild_stand_in, ("cls", (4,), 0, "h")), device_index=3) == "h"
    assert seen["device"] == 3
