"""GPU check of `VLLMEngine`'s weight reload (asp.rollout.vllm_weights) and shutdown, per weight transport.

Needs one CUDA GPU and ``pip install 'asp[vllm]'``; nothing is downloaded. By default it builds a random tiny
Qwen2 (the demo tokenizer, hidden 256, 4 layers, tied embeddings) under ``--tmp``; ``--model DIR`` uses a local
checkpoint instead (e.g. a Qwen3-8B directory: then the reload seconds are the ones that matter). Then, on one
engine (``enforce_eager``, bf16):

1. greedy-decode a few prompts with the checkpoint's weights A;
2. for each transport in ``--transfers`` (ipc, rpc): load weights B (A with 10 % multiplicative noise on every
   floating tensor), decode, load A again, decode: B must change the output and A must restore it exactly;
   each ``update_weights`` is timed;
3. ``close()``, and the GPU memory free before the engine, with it, and after close (``torch.cuda.mem_get_info``).

Prints one JSON object and writes it to ``--out`` (exit code 1 when a check fails). Run from the repository root::

    timeout 540 python scripts/gpu_vllm_reload.py --out outputs/gpu_vllm_reload.json
    python scripts/gpu_vllm_reload.py --model /models/Qwen3-8B --bucket-mb 512 --out outputs/reload_8b.json

This script has not run yet (no GPU where it was written); see the README for its results once it has.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch


def tiny_checkpoint(root: Path) -> Path:
    """A random tiny Qwen2 with the demo tokenizer, saved in bf16 as safetensors."""
    from asp.demo.policy import build_model
    from asp.demo.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model = build_model(
        tok, hidden_size=256, num_layers=4, num_heads=4, intermediate_size=512, max_position_embeddings=512, seed=0
    )
    path = root / "tiny-qwen2"
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def checkpoint_state(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors files, on the CPU."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    return state


def perturbed(state: dict[str, torch.Tensor], seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        if t.is_floating_point():
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32)
            t = (t.float() * (1 + 0.1 * noise)).to(t.dtype)
        out[name] = t
    return out


def free_gib() -> float:
    return torch.cuda.mem_get_info()[0] / 2**30


def run(args: argparse.Namespace) -> dict:
    from asp.rollout import SamplingParams
    from asp.rollout.vllm import VLLMEngine
    from asp.rollout.vllm_weights import BucketedLoader
    from asp.rollout.weight_transfer import MIB

    tmp = Path(tempfile.mkdtemp(dir=args.tmp))
    model = Path(args.model) if args.model else tiny_checkpoint(tmp)
    weights_a = checkpoint_state(model)
    weights_b = perturbed(weights_a)
    prompts = ["w1 w2 w3", "12 + 30 =", "The weights are"]
    greedy = SamplingParams(n=1, max_new_tokens=args.max_tokens, temperature=0.0, seed=0, top_p=1.0)
    report: dict = {"model": str(model), "tensors": len(weights_a), "bucket_mb": args.bucket_mb}
    report["bytes"] = sum(t.numel() * t.element_size() for t in weights_a.values())
    report["free_gib_before"] = free_gib()
    t0 = time.perf_counter()
    engine = VLLMEngine(
        model, dtype="bfloat16", seed=0, enforce_eager=True, gpu_memory_utilization=args.gpu_memory_utilization
    )
    report["engine_start_s"] = time.perf_counter() - t0
    report["free_gib_with_engine"] = free_gib()

    def decode() -> list[list[int]]:
        return [r.samples[0].token_ids for r in engine.generate(prompts, greedy)]

    out_a = decode()
    ok = True
    for transfer in args.transfers.split(","):
        engine.loader = BucketedLoader(engine._rpc, transfer, args.bucket_mb * MIB)
        row: dict = {}
        t = time.perf_counter()
        engine.update_weights(weights_b)
        row["load_b_s"] = time.perf_counter() - t
        out_b = decode()
        t = time.perf_counter()
        engine.update_weights(weights_a)
        row["load_a_s"] = time.perf_counter() - t
        row["buckets"] = engine.loader.buckets_sent // 2
        row["b_changed_output"] = out_b != out_a
        row["a_restored_output"] = decode() == out_a
        ok &= row["b_changed_output"] and row["a_restored_output"]
        report[transfer] = row
    engine.close()
    torch.cuda.synchronize()
    time.sleep(2)  # the engine-core process exits asynchronously
    report["free_gib_after_close"] = free_gib()
    report["close_freed"] = report["free_gib_after_close"] > report["free_gib_with_engine"] + 0.5 * (
        report["free_gib_before"] - report["free_gib_with_engine"]
    )
    report["ok"] = bool(ok and report["close_freed"])
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local checkpoint directory (default: a random tiny Qwen2)")
    parser.add_argument("--transfers", default="ipc,rpc")
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--tmp", default=None, help="where the tiny checkpoint is written (default: the temp dir)")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    args = parser.parse_args()
    report = run(args)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
