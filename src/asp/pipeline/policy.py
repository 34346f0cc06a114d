"""`policy` stage: the checkpoint every later stage rolls out.

* `policy.source: build` (demo preset): build a tiny Qwen2-architecture causal LM with its own tokenizer,
  warm-start it on the built-in demo task with a short supervised run on CPU, check it (length Spearman and
  mean reward sampled at temperature 1) and save an ordinary Hugging Face checkpoint.
* `policy.source: path` (cluster preset): record the user's local checkpoint path and a content hash.

Either way `outputs/policy/policy.json` names the checkpoint; later stages call `asp.pipeline.loaders.policy_model_path`.

Run: `asp stage policy` (what `dvc repro policy` calls).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asp.config import Params, PolicyParams
from asp.errors import UserError
from asp.io import atomic_path, write_json
from asp.progress import progress_bar
from asp.tracking import Tracker


@dataclass(frozen=True)
class Paths:
    out_dir: Path = Path("outputs/policy")
    metrics: Path = Path("metrics/policy.json")


def check_checkpoint(path: str | Path, what: str = "policy.path") -> Path:
    """Raise a clear error unless `path` is a local Hugging Face checkpoint with config and tokenizer."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise UserError(f"{what} = '{path}': not a directory. Give a local Hugging Face checkpoint directory.")
    if not (path / "config.json").is_file():
        raise UserError(f"{what} = '{path}': no config.json there; is this a Hugging Face checkpoint directory?")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise UserError(f"{what} = '{path}': no tokenizer files (tokenizer.json / tokenizer_config.json) there.")
    return path.resolve()


def content_hash(path: Path) -> str:
    """sha256 over every file's relative name and bytes, in sorted order (streamed, 1 MiB blocks)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file())
    for f in progress_bar(files, desc="hashing checkpoint", unit="file"):
        digest.update(f.relative_to(path).as_posix().encode() + b"\0")
        with f.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def build_demo_policy(p: PolicyParams, seed: int, model_dir: Path) -> tuple[dict[str, float], list[float]]:
    """Build, warm-start, save and check the demo policy; return its metrics and warm-start loss curve."""
    from asp.demo.policy import build_model, evaluate_policy, warm_start
    from asp.demo.task import generate_problems
    from asp.demo.tokenizer import build_tokenizer

    d = p.demo
    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer,
        hidden_size=d.hidden_size,
        num_layers=d.num_layers,
        num_heads=d.num_heads,
        intermediate_size=d.intermediate_size,
        max_position_embeddings=d.max_position_embeddings,
        seed=seed,
    )
    records = generate_problems(d.warm_start_problems, seed=seed + 100)
    t0 = time.perf_counter()
    with progress_bar(total=d.warm_start_steps, desc="warm start", unit="step") as bar:

        def on_step(step: int, total: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")

        history = warm_start(
            model,
            tokenizer,
            records,
            steps=d.warm_start_steps,
            batch_size=d.batch_size,
            lr=d.lr,
            seed=seed,
            progress=on_step,
            num_threads=d.num_threads,
        )
    warm_s = time.perf_counter() - t0
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    e = p.eval
    check = evaluate_policy(
        model,
        tokenizer,
        generate_problems(e.prompts, seed=seed + 200),
        n_samples=e.samples,
        temperature=e.temperature,
        max_new_tokens=e.max_new_tokens,
        seed=seed,
        batch_size=e.batch_size,
        num_threads=d.num_threads,
    )
    losses = history.get("loss", [])
    return {
        "policy/warm_start_s": warm_s,
        "policy/final_loss": float(losses[-1]) if losses else float("nan"),
        **{f"policy/{k}": float(v) for k, v in check.items() if isinstance(v, int | float)},
    }, losses


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Build (demo) or record (cluster) the policy checkpoint and write `policy.json`."""
    p, seed = params.policy, params.common.seed
    tracker.log_params({"policy": p.model_dump(), "common.seed": seed})
    with atomic_path(paths.out_dir) as out:
        out.mkdir(parents=True)
        if p.source == "build":
            model_dir = out / "model"
            metrics, losses = build_demo_policy(p, seed, model_dir)
            for step, loss in enumerate(losses):
                tracker.log_metrics({"policy/warm_start_loss": loss}, step=step)
            final_dir = paths.out_dir / "model"  # relative: the repo may be cloned elsewhere
            digest = content_hash(model_dir)
        else:
            final_dir = check_checkpoint(p.path)
            metrics, digest = {}, content_hash(final_dir)
        n_bytes = sum(f.stat().st_size for f in (model_dir if p.source == "build" else final_dir).rglob("*"))
        metrics["policy/checkpoint_mb"] = n_bytes / 2**20
        write_json({"model_path": str(final_dir), "source": p.source, "sha256": digest}, out / "policy.json")
    write_json(metrics, paths.metrics)
    tracker.log_metrics(metrics)
    tracker.set_tags({"policy.sha256": digest, "policy.path": str(final_dir)})
    return metrics
