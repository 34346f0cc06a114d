"""Mixture-of-experts memory: parameter counts worked out by hand for Qwen3-30B-A3B, Qwen1.5-MoE-A2.7B and
Mixtral-8x7B (the arithmetic is in the comments) and checked against ``sum(p.numel())`` of randomly initialised tiny
transformers models of each family (CPU, nothing downloaded); the MoE block's activations against what autograd
actually saves for backward in transformers' MoE blocks; every expert in parameters, gradients, optimizer state and
vLLM weights, the active experts in activations."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from asp.sim.architecture import BUILTIN, Architecture, from_hf_config
from asp.sim.memory import (
    GenerationSettings,
    TrainerSettings,
    activation_bytes,
    generation_memory,
    moe_activation_bytes_per_token,
    trainer_memory,
)

from .helpers import check_fit

Q30 = BUILTIN["qwen3-30b-a3b"]
QMOE = BUILTIN["qwen1.5-moe-a2.7b"]
MIXTRAL = BUILTIN["mixtral-8x7b"]

# config.json of Qwen/Qwen3-30B-A3B (the keys that decide the shapes)
QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "max_position_embeddings": 40960,
}


def test_qwen3_30b_a3b_by_hand_30_5b_total_3_3b_active() -> None:
    # attention per layer: q 2048*4096 = 8,388,608, k and v 2048*512 = 1,048,576 each, o 4096*2048 = 8,388,608,
    # q/k norms 2*128 = 256, two RMSNorms 2*2048 = 4,096 -> 18,878,720
    assert Q30.attention_params == 18_878_720
    # MoE block: router 2048*128 = 262,144 + 128 experts * 3*2048*768 (4,718,592 each) = 603,979,776 -> 604,241,920
    assert Q30.moe_params(128) == 604_241_920
    assert Q30.layer_params == 18_878_720 + 604_241_920 == 623_120_640
    # 48 layers = 29,909,790,720 + embedding and lm_head 2*151936*2048 = 622,329,856 + final norm 2,048
    assert Q30.num_params == 30_532_122_624  # 30.5B
    # active: 8 experts instead of 128: 18,878,720 + 262,144 + 8*4,718,592 = 56,889,600 per layer;
    # 48 * 56,889,600 = 2,730,700,800 + 622,331,904 = 3,353,032,704
    assert Q30.active_params == 3_353_032_704  # 3.3B
    assert from_hf_config(QWEN3_30B_A3B_CONFIG) == Q30  # the published config.json reads as the built-in


def test_qwen15_moe_and_mixtral_by_hand() -> None:
    # Qwen1.5-MoE-A2.7B: attention 4*2048*2048 = 16,777,216 + q/k/v biases 3*2048 = 6,144 + norms 4,096 = 16,787,456;
    # MoE: router 2048*60 = 122,880 + 60 experts * 3*2048*1408 (8,650,752) = 519,045,120 + shared expert
    # 3*2048*5632 = 34,603,008 + its gate 2,048 -> 553,773,056; layer 570,560,512; x 24 = 13,693,452,288
    # + 2*151936*2048 + 2048 = 622,331,904 -> 14,315,784,192 (published: 14.3B)
    assert QMOE.layer_params == 570_560_512 and QMOE.num_params == 14_315_784_192
    # active: 16,787,456 + 122,880 + 4*8,650,752 + 34,605,056 = 86,118,400; x 24 + 622,331,904 = 2,689,173,504 (2.7B)
    assert QMOE.active_params == 2_689_173_504
    # Mixtral-8x7B: attention 2*4096*4096 + 2*4096*1024 + 2*4096 = 41,951,232; MoE: router 4096*8 = 32,768
    # + 8 * 3*4096*14336 (176,160,768) = 1,409,286,144 -> layer 1,451,270,144; x 32 = 46,440,644,608
    # + 2*32000*4096 + 4096 = 262,148,096 -> 46,702,792,704 (published: 46.7B)
    assert MIXTRAL.num_params == 46_702_792_704
    # active: 41,951,232 + 32,768 + 2*176,160,768 = 394,305,536; x 32 + 262,148,096 = 12,879,925,248 (12.9B)
    assert MIXTRAL.active_params == 12_879_925_248
    qmoe_config = {
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "decoder_sparse_step": 1,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "max_position_embeddings": 8192,
    }
    assert from_hf_config(qmoe_config) == QMOE  # qkv_bias absent: transformers' default (True)
    mixtral_config = {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
    }
    assert from_hf_config(mixtral_config) == MIXTRAL


def test_dense_models_are_unchanged_and_bad_moe_configs_are_named() -> None:
    q8 = BUILTIN["qwen3-8b"]
    assert not q8.is_moe and q8.active_params == q8.num_params == 8_190_735_360
    with pytest.raises(ValueError, match="'num_experts_per_tok'"):
        from_hf_config({k: v for k, v in QWEN3_30B_A3B_CONFIG.items() if k != "num_experts_per_tok"})
    with pytest.raises(ValueError, match="DeepSeek-style"):
        from_hf_config({**QWEN3_30B_A3B_CONFIG, "n_routed_experts": 256})
    with pytest.raises(ValueError, match="experts per token 9"):
        replace(Q30, num_experts=8, experts_per_token=9)


def _tiny_models() -> list[tuple[str, object]]:
    """Tiny configs of the three MoE families: dense and sparse layers mixed, a shared expert, tied embeddings."""
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    shapes = dict(
        vocab_size=97, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64
    )
    return [
        (  # layers 1 and 3 sparse by decoder_sparse_step 2, layer 3 forced dense by mlp_only_layers: 1 sparse of 4
            "qwen3_moe",
            Qwen3MoeConfig(
                **shapes,
                num_hidden_layers=4,
                head_dim=16,
                intermediate_size=48,
                moe_intermediate_size=24,
                num_experts=6,
                num_experts_per_tok=2,
                decoder_sparse_step=2,
                mlp_only_layers=[3],
            ),
        ),
        (
            "qwen3_moe tied",
            Qwen3MoeConfig(
                **shapes,
                num_hidden_layers=2,
                num_experts=4,
                num_experts_per_tok=1,
                moe_intermediate_size=16,
                tie_word_embeddings=True,
            ),
        ),  # fmt: skip
        (
            "qwen2_moe",
            Qwen2MoeConfig(
                **shapes,
                num_hidden_layers=3,
                intermediate_size=40,
                moe_intermediate_size=20,
                shared_expert_intermediate_size=36,
                num_experts=5,
                num_experts_per_tok=2,
            ),
        ),
        ("mixtral", MixtralConfig(**shapes, num_hidden_layers=2, intermediate_size=40, num_local_experts=4)),
    ]


def test_parameter_count_matches_transformers_tiny_models(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from asp.steps.memory_check import read_config_json

    for name, config in _tiny_models():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        total = sum(p.numel() for p in model.parameters())  # tied lm_head: counted once
        arch = from_hf_config(config.to_dict())
        assert arch.is_moe and arch.num_params == total, name
        config.save_pretrained(tmp_path / name.replace(" ", "_"))  # the config.json transformers itself writes
        assert read_config_json(tmp_path / name.replace(" ", "_") / "config.json") == arch, name
        # active: the model minus the experts a token does not use (an expert's three matrices: 3 h I_e)
        experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        unused = arch.sparse_layers * (arch.num_experts - arch.experts_per_token)
        assert arch.active_params == total - experts + experts // arch.num_experts * arch.experts_per_token, name
        assert experts == arch.sparse_layers * arch.num_experts * 3 * arch.hidden_size * arch.expert_intermediate_size
        assert total - arch.active_params == unused * 3 * arch.hidden_size * arch.expert_intermediate_size
    sparse = from_hf_config(_tiny_models()[0][1].to_dict())
    assert (sparse.sparse_layers, sparse.dense_layers) == (1, 3)
    assert json.loads((tmp_path / "qwen3_moe" / "config.json").read_text())["model_type"] == "qwen3_moe"


def _saved_bytes_per_token(block: object, tokens: int, hidden: int) -> float:
    """Bytes autograd saves for backward in one forward of `block` on `tokens` fp32 tokens, per token: distinct
    storages, the block's parameters and its input (a norm output, counted with the attention part) excluded."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    x = torch.randn(1, tokens, hidden, requires_grad=True)
    skip = params | {x.untyped_storage().data_ptr()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return sum(saved.values()) / tokens


def test_moe_block_activations_match_what_autograd_saves() -> None:
    import torch
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    blocks = {
        "qwen3_moe": Qwen3MoeSparseMoeBlock,
        "qwen2_moe": Qwen2MoeSparseMoeBlock,
        "mixtral": MixtralSparseMoeBlock,
    }
    for name, config in _tiny_models():
        if name not in blocks:
            continue
        config._experts_implementation = "grouped_mm"  # transformers' default (what from_pretrained picks)
        torch.manual_seed(0)
        block = blocks[name](config)
        for p in block.parameters():
            torch.nn.init.normal_(p, std=0.1)  # routers start at zero: spread the routing
        arch = from_hf_config(config.to_dict())
        measured = _saved_bytes_per_token(block, 256, arch.hidden_size)
        estimate = moe_activation_bytes_per_token(arch, 4)
        # the experts' rows dominate; the estimate rounds the routing bookkeeping (indices, weights) up to 40k bytes
        assert abs(estimate - measured) <= 0.02 * measured, (name, estimate, measured)


def test_trainer_counts_every_expert_and_activations_the_active_ones() -> None:
    s = TrainerSettings(
        world_size=8,
        mixed_precision=True,
        compute_bytes=2,
        activation_checkpointing=True,
        micro_batch_tokens=10240,
        cpu_offload=False,
    )
    est = trainer_memory(Q30, s)
    shard = 30_532_122_624 // 8  # 3,816,515,328 parameters per rank: all 128 experts, sharded
    assert est.device["parameters"] == est.device["gradients"] == 4 * shard
    assert est.device["optimizer"] == 8 * shard  # 28.4 GiB of AdamW state, not the 3.1 GiB a 3.3B model would need
    # FSDP2 gathers whole layers, every expert: bf16 x (2 root + 3 layers) = 2 * (2 * 622,331,904 + 3 * 623,120,640)
    assert est.device["gathered"] == 2 * (2 * 622_331_904 + 3 * 623_120_640)
    # A_s = 2*(5*2048 + 3*4096 + 4*512) + 8*2048 = 65,536 (attention, norms) + MoE block 2*8*(2*2048 + 4*768)
    # = 114,688 + router 4*128 = 512 + 40*8 = 320 -> 181,056 bytes per token and layer;
    # checkpointed: 10240 * (48 * 2 * 2048 + 181,056) = 10240 * 377,664
    assert est.device["activations"] == 3_867_279_360
    more_experts = trainer_memory(replace(Q30, num_experts=256), s)  # activations follow k, not E (router only)
    assert more_experts.device["activations"] - est.device["activations"] == 10240 * 4 * 128
    assert more_experts.device["optimizer"] > 1.9 * est.device["optimizer"]
    plain = replace(s, activation_checkpointing=False)  # 48 sparse layers: 10240 * (48 * 181,056 + 2*2*2048)
    assert activation_bytes(Q30, plain) == 10240 * (48 * 181_056 + 8192)


def test_generation_loads_every_expert() -> None:
    est = generation_memory(Q30, GenerationSettings(max_seq_len=10240, tensor_parallel_size=1))
    assert est.weights == 2 * 30_532_122_624  # bf16, all 128 experts: 56.9 GiB
    assert est.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2 == 98_304
    # 1 GiB + 8192 * (4*2048 + 8*(3*768 + 2048)) * 2 + 256 * 151,936 * 4 = 1,073,741,824 + 704,643,072 + 155,582,464
    assert est.allowance == 1_933_967_360
    # (73,014,444,032 - 61,064,245,248 - 1,933,967,360) // (98,304 * 10,240) = 10,016,231,424 // 1,006,632,960
    assert est.sequences == 9 and est.fits
    two = generation_memory(Q30, GenerationSettings(max_seq_len=10240, tensor_parallel_size=2))
    assert two.weights == 30_532_122_624 and two.sequences > est.sequences


def test_qwen3_30b_a3b_on_one_80gib_gpu_is_refused_with_fixes_that_fit() -> None:
    s = TrainerSettings(
        world_size=1,
        mixed_precision=True,
        compute_bytes=2,
        activation_checkpointing=True,
        micro_batch_tokens=8192,
        cpu_offload=False,
    )
    (problem,) = check_fit(Q30, s)
    # 16 B x 30.5B = 455 GiB of fp32 weights, gradients and AdamW moments on one rank
    assert "parameters 113.7, gradients 113.7, optimizer 227.5" in problem and "of 80.0 GiB" in problem
    # the old reading of its config.json: a dense model with intermediate_size 6144 (3.34B parameters)
    dense_reading = Architecture(151936, 2048, 48, 32, 4, 128, 6144, False, qk_norm=True)
    assert trainer_memory(dense_reading, s).fits  # what the dense reading used to say
    n = int(re.search(r"world_size to (\d+)", problem).group(1))  # the smallest world size that fits
    assert (
        trainer_memory(Q30, replace(s, world_size=n)).fits
        and not trainer_memory(Q30, replace(s, world_size=n - 1)).fits
    )
    assert n > 6  # 455 GiB of states alone need at least 6 ranks of 80 GiB
