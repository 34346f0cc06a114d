"""The memory estimate against numbers worked out by hand (the arithmetic is in the comments) for two model sizes,
Qwen2.5-1.5B and Qwen3-8B: parameter counts against their published sizes, bytes per trainer component, the vLLM
KV cache, and `check_fit`'s suggestions (each one re-checked with the estimator)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from asp.sim.memory import (
    BUILTIN,
    GIB,
    Architecture,
    GenerationSettings,
    TrainerSettings,
    from_hf_config,
    generation_memory,
    trainer_memory,
)

from .helpers import check_fit

Q15 = BUILTIN["qwen2.5-1.5b"]
Q8 = BUILTIN["qwen3-8b"]


def test_parameter_counts_by_hand_and_published() -> None:
    # Qwen2.5-1.5B (tied, qkv bias): per layer q 1536*1536 = 2,359,296 (+1,536 bias), k and v 1536*256 = 393,216
    # (+256 bias each), o 2,359,296, MLP 3*1536*8960 = 41,287,680, norms 2*1536 = 3,072 -> 46,797,824;
    # x 28 = 1,310,339,072; + embedding 151936*1536 = 233,373,696 + final norm 1,536 = 1,543,714,304 (1.54B).
    assert Q15.layer_params == 46_797_824
    assert Q15.num_params == 1_543_714_304
    # Qwen3-8B (untied, q/k norms): per layer q 4096*4096 = 16,777,216, k and v 4096*1024 = 4,194,304 each,
    # o 16,777,216, MLP 3*4096*12288 = 150,994,944, norms 8,192, q/k norms 2*128 = 256 -> 192,946,432;
    # x 36 = 6,946,071,552; + embedding and lm_head 2*151936*4096 = 1,244,659,712 + final norm 4,096
    # = 8,190,735,360 (8.19B).
    assert Q8.layer_params == 192_946_432
    assert Q8.num_params == 8_190_735_360
    published = {
        "qwen2.5-0.5b": 0.49,
        "qwen2.5-7b": 7.62,
        "qwen2.5-14b": 14.77,
        "qwen3-4b": 4.02,
        "llama-3.1-8b": 8.03,
    }
    for name, billions in published.items():
        assert BUILTIN[name].num_params / 1e9 == pytest.approx(billions, abs=0.08), name


def test_from_hf_config_reads_qwen2_and_qwen3_and_names_a_missing_key() -> None:
    qwen2 = {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
    }
    assert from_hf_config(qwen2) == Q15
    qwen3 = {**qwen2, "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "head_dim": 128}
    qwen3.update(num_attention_heads=32, num_key_value_heads=8, intermediate_size=12288, tie_word_embeddings=False)
    assert from_hf_config({"text_config": {**qwen3, "max_position_embeddings": 40960}}) == Q8
    with pytest.raises(ValueError, match="'intermediate_size'"):
        from_hf_config({k: v for k, v in qwen2.items() if k != "intermediate_size"})


def test_trainer_bytes_qwen3_8b_on_four_ranks_bf16_checkpointed() -> None:
    s = TrainerSettings(
        world_size=4,
        mixed_precision=True,
        compute_bytes=2,
        activation_checkpointing=True,
        micro_batch_tokens=8192,
        cpu_offload=False,
    )
    est = trainer_memory(Q8, s)
    shard = 8_190_735_360 // 4  # 2,047,683,840 parameters per rank
    assert est.device["parameters"] == 4 * shard == 8_190_735_360  # fp32 master shard
    assert est.device["gradients"] == 8_190_735_360  # fp32 gradient shard
    assert est.device["optimizer"] == 8 * shard == 16_381_470_720  # AdamW exp_avg + exp_avg_sq, fp32
    # root = 2*151936*4096 + 4096 = 1,244,663,808; bf16 x (2 root + 3 layers) = 2*(2,489,327,616 + 578,839,296)
    assert est.device["gathered"] == 6_136_333_824
    # A = 2*(5*4096 + 3*4096 + 4*1024 + 4*12288) + 8*4096 = 2*86,016 + 32,768 = 204,800 bytes per token and layer;
    # checkpointed: 8192 * (36 layers * 2 B * 4096 + A) = 8192 * 499,712
    assert est.device["activations"] == 4_093_640_704
    # logits: 8192 tokens * 151,936 vocab * (2 bf16 + 12) = 8192 * 2,127,104
    assert est.device["logits"] == 17_425_235_968
    assert est.device["reserve"] == 3 * GIB
    # 2 * 8,190,735,360 + 16,381,470,720 + 6,136,333,824 + 4,093,640,704 + 17,425,235,968 + 3 GiB = 59.3 GiB
    assert est.device_total == 63_639_377_408 and est.fits


def test_trainer_bytes_qwen25_15b_on_one_rank_fp32() -> None:
    est = trainer_memory(
        Q15, TrainerSettings(micro_batch_tokens=4096, world_size=1, activation_checkpointing=False, cpu_offload=False)
    )
    assert est.device["parameters"] == est.device["gradients"] == 4 * 1_543_714_304 == 6_174_857_216
    assert est.device["optimizer"] == 12_349_714_432
    assert est.device["gathered"] == 0  # one rank, fp32: nothing to gather or cast
    # A = 4*(5*1536 + 3*1536 + 4*256 + 4*8960) + 8*1536 = 4*49,152 + 12,288 = 208,896;
    # no checkpointing: 4096 * (28 * A + 2 * 4 B * 1536) = 4096 * 5,861,376
    assert est.device["activations"] == 24_008_196_096
    assert est.device["logits"] == 4096 * 151_936 * 16 == 9_957_277_696  # fp32 logits + 12
    # 2 * 6,174,857,216 + 12,349,714,432 + 24,008,196,096 + 9,957,277,696 + 3 GiB = 57.6 GiB
    assert est.device_total == 61_886_128_128 and est.fits


def test_sharding_checkpointing_offload_and_reference() -> None:
    base = TrainerSettings(
        world_size=1,
        mixed_precision=True,
        compute_bytes=2,
        micro_batch_tokens=4096,
        activation_checkpointing=False,
        cpu_offload=False,
    )
    one, eight = trainer_memory(Q8, base), trainer_memory(Q8, replace(base, world_size=8))
    for key in ("parameters", "gradients", "optimizer"):
        assert eight.device[key] == one.device[key] // 8
    assert eight.device["activations"] == one.device["activations"]  # per-rank micro-batch: not sharded
    ckpt = trainer_memory(Q8, replace(base, activation_checkpointing=True))
    assert ckpt.device["activations"] < one.device["activations"] / 5
    off = trainer_memory(Q8, replace(base, cpu_offload=True))
    assert "parameters" not in off.device and off.host["optimizer"] == one.device["optimizer"]
    assert off.host_total == 16 * Q8.num_params and off.device_total < one.device_total
    ref = trainer_memory(Q8, replace(base, reference=True))
    assert ref.device["reference"] == 4 * Q8.num_params  # the trainer's frozen fp32 copy, whole, on the device
    assert ref.device["logits"] - one.device["logits"] == 4096 * 151_936 * 4  # its fp32 logits (no autocast)
    ref16 = trainer_memory(Q8, replace(base, reference=True, autocast=True, cpu_offload=True))
    assert ref16.device["reference"] == 4 * Q8.num_params and "reference" not in ref16.host
    assert ref16.device["logits"] - one.device["logits"] == 4096 * 151_936 * 2  # bf16 under autocast
    fp32_offload = trainer_memory(
        Q15, TrainerSettings(cpu_offload=True, world_size=1, activation_checkpointing=False)
    )  # one rank, offload: FSDP2 all-gathers
    assert fp32_offload.device["gathered"] == 4 * (2 * Q15.root_params + 3 * Q15.layer_params)
    longest = trainer_memory(Q8, replace(base, longest_row_tokens=10240))
    assert longest.device["logits"] == 10240 * 151_936 * 14  # a row longer than the budget sets the tokens


def test_generation_qwen3_8b_kv_cache_and_sequences() -> None:
    est = generation_memory(Q8, GenerationSettings(max_seq_len=10240, tensor_parallel_size=1))
    assert est.weights == 2 * 8_190_735_360  # bf16
    assert est.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456  # K and V, 36 layers, 8 kv heads
    # 1 GiB + 8192 * (4*4096 + 3*12288) * 2 + 256 * 151,936 * 4 = 1,073,741,824 + 872,415,232 + 155,582,464
    assert est.allowance == 2_101_739_520
    assert est.budget == int(0.85 * 80 * GIB) == 73_014_444_032
    # (73,014,444,032 - 16,381,470,720 - 2,101,739,520) // (147,456 * 10,240) = 54,531,233,792 // 1,509,949,440
    assert est.kv_cache == 54_531_233_792 and est.sequences == 36 and est.fits


def test_generation_kv_per_token_splits_over_tensor_parallel() -> None:
    one = generation_memory(Q15, GenerationSettings(max_seq_len=4096, tensor_parallel_size=1))
    assert one.kv_bytes_per_token == 2 * 28 * 2 * 128 * 2 == 28_672
    two = generation_memory(Q15, GenerationSettings(tensor_parallel_size=2, max_seq_len=4096))
    assert two.kv_bytes_per_token == 14_336 and two.weights == one.weights // 2
    four = generation_memory(Q15, GenerationSettings(tensor_parallel_size=4, max_seq_len=4096))
    assert four.kv_bytes_per_token == 14_336  # 2 kv heads over 4 GPUs: each keeps one (replicated)


def test_check_fit_is_empty_when_everything_fits() -> None:
    s = TrainerSettings(
        world_size=4, mixed_precision=True, compute_bytes=2, activation_checkpointing=True, cpu_offload=False
    )
    assert (
        check_fit(
            Q8, replace(s, micro_batch_tokens=8192), GenerationSettings(max_seq_len=10240, tensor_parallel_size=1)
        )
        == []
    )


def _suggested(problem: str, key: str) -> int:
    match = re.search(rf"{key} to (\d+)", problem)
    assert match, problem
    return int(match.group(1))


def test_check_fit_suggests_values_that_fit() -> None:
    s = TrainerSettings(
        world_size=1, mixed_precision=True, compute_bytes=2, activation_checkpointing=True, cpu_offload=False
    )
    s = replace(s, micro_batch_tokens=8192)
    (problem,) = check_fit(Q8, s)
    assert "trainer device: needs" in problem and "of 80.0 GiB" in problem
    n = _suggested(problem, "world_size")  # the smallest world size that fits, found by the estimator
    assert trainer_memory(Q8, replace(s, world_size=n)).fits
    assert not trainer_memory(Q8, replace(s, world_size=n - 1)).fits
    big = replace(s, world_size=8, micro_batch_tokens=65536)
    (problem,) = check_fit(Q8, big)
    m = _suggested(problem, "micro_batch_tokens")
    assert m % 256 == 0 and trainer_memory(Q8, replace(big, micro_batch_tokens=m)).fits
    assert not trainer_memory(Q8, replace(big, micro_batch_tokens=m + 256)).fits
    assert "activation_checkpointing" not in problem  # already on


def test_check_fit_one_fp32_gpu_for_8b_needs_several_changes() -> None:
    (problem,) = check_fit(
        Q8, TrainerSettings(world_size=1, micro_batch_tokens=8192, activation_checkpointing=False, cpu_offload=False)
    )
    assert "needs 2" in problem and "no single change fits" in problem and "bfloat16" in problem


def test_generation_refused_when_weights_leave_no_kv_cache() -> None:
    q32 = BUILTIN["qwen2.5-32b"]  # 32.76B x 2 B = 61.0 GiB of weights on one GPU
    s = GenerationSettings(max_seq_len=32768, tensor_parallel_size=1)
    (problem,) = check_fit(q32, None, s)
    assert "less than one 32768-token sequence" in problem and "tensor_parallel_size to 2" in problem
    assert generation_memory(q32, replace(s, tensor_parallel_size=2)).fits
    tiny = Architecture(100, 64, 2, 4, 4, 16, 128, True)
    assert (
        check_fit(tiny, None, GenerationSettings(gpu_memory_utilization=0.01, device_gib=80, tensor_parallel_size=1))
        != []
    )
