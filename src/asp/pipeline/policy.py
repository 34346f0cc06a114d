"""`policy` stage: the checkpoint every later stage rolls out.

* `policy.source: build` (demo preset): build a tiny Qwen2-architecture causal LM with its own tokenizer,
  warm-start it on the built-in demo task with a short supervised run on CPU, check it (length Spearman and
  mean reward sampled at temperature 1) and save an ordinary Hugging Face checkpoint.
* `policy.source: path` (cluster preset): record the user's local checkpoint path and a content hash.

Either way `outputs/policy/policy.json` names the checkpoint; later stages call
`asp.steps.loaders.policy_model_path`.

Run: `asp stage policy` (what `dvc repro policy` calls).
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asp.config import DemoPolicyParams, Params, PolicyEvalParams, PolicyParams
from asp.demo.task import generate_problems, warm_start_responses
from asp.errors import UserError
from asp.io import atomic_path, write_json
from asp.progress import progress_bar
from asp.steps.paths import PolicyPaths as Paths
from asp.tracking import Tracker


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


@dataclass
class WarmStart:
    """A warm-started demo policy and how it got there (`warm_started_policy`).

    Attributes:
        model, tokenizer: the policy.
        losses: per-step training loss.
        seconds: wall time of the warm start, validation checks included.
        checks: ``(step, validation reward, length Spearman)`` of every check (empty without ``target_reward``).
        steps: optimizer steps taken (``warm_start_steps`` unless the target ended it earlier).
        target: ``policy.demo.target_reward`` (None: no checks).
        target_spearman: ``policy.demo.target_spearman`` (None: the reward alone decides).
    """

    model: Any
    tokenizer: Any
    losses: list[float]
    seconds: float
    checks: list[tuple[int, float, float]]
    steps: int
    target: float | None
    target_spearman: float | None

    @property
    def reached(self) -> bool | None:
        """Whether the last check reached the target (None without checks)."""
        if not self.checks or self.target is None:
            return None
        return meets(self.checks[-1], self.target, self.target_spearman)


def warm_started_policy(demo: DemoPolicyParams, evaluation: PolicyEvalParams, seed: int) -> WarmStart:
    """Build the tiny demo policy and warm-start it, up to `demo.warm_start_steps` or, with `demo.target_reward`,
    until a check on new problems (seed + 400) reaches the target reward and, with `demo.target_spearman`, the
    target length tracking."""
    from asp.demo.policy import build_model, warm_start
    from asp.demo.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer,
        hidden_size=demo.hidden_size,
        num_layers=demo.num_layers,
        num_heads=demo.num_heads,
        intermediate_size=demo.intermediate_size,
        max_position_embeddings=demo.max_position_embeddings,
        seed=seed,
    )
    records = generate_problems(demo.warm_start_problems, seed=seed + 100)
    responses = warm_start_targets(demo, records, seed)
    checks: list[tuple[int, float, float]] = []
    shown: dict[str, str] = {}  # the bar's postfix: the last step's loss, the last check's reward and Spearman
    stop = None
    if demo.target_reward is not None:
        target, validation = demo.target_reward, generate_problems(demo.check_problems, seed=seed + 400)

        def stop(step: int) -> bool:
            check = check_policy(model, tokenizer, evaluation, seed, demo.num_threads, validation)
            checks.append((step, float(check["mean_reward"]), float(check["spearman"])))
            shown["validation_reward"] = f"{checks[-1][1]:.3f}"
            shown["spearman"] = f"{checks[-1][2]:.2f}"
            bar.set_postfix(shown)
            return meets(checks[-1], target, demo.target_spearman)

    t0 = time.perf_counter()
    with progress_bar(total=demo.warm_start_steps, desc="warm start", unit="step") as bar:

        def on_step(step: int, total: int, loss: float) -> None:
            bar.update(1)
            shown["loss"] = f"{loss:.3f}"
            bar.set_postfix(shown)

        history = warm_start(
            model,
            tokenizer,
            records,
            steps=demo.warm_start_steps,
            batch_size=demo.batch_size,
            lr=demo.lr,
            seed=seed,
            progress=on_step,
            num_threads=demo.num_threads,
            responses=responses,
            stop=stop,
            stop_every=demo.check_every,
            stop_from=min(demo.check_from, demo.warm_start_steps),
        )
    seconds = time.perf_counter() - t0
    warm = WarmStart(
        model, tokenizer, history["loss"], seconds, checks, history["steps"], demo.target_reward, demo.target_spearman
    )
    if warm.reached is False:
        rho = "" if demo.target_spearman is None else f" or target_spearman {demo.target_spearman}"
        print(
            f"[policy] warm start: validation reward {checks[-1][1]:.3f} (length Spearman {checks[-1][2]:.2f}) after "
            f"all {warm.steps} steps is below policy.demo.target_reward {demo.target_reward}{rho}; raise "
            "policy.demo.warm_start_steps to reach it",
            file=sys.stderr,
        )
    return warm


def warm_start_targets(demo: DemoPolicyParams, records: list[dict], seed: int) -> list[str] | None:
    """The warm start's target responses: None (every record's reference) unless `demo` asks for shortcuts (the drift
    demo: GRPO lengthens them) or answer slips (an imperfect demonstrator: GRPO's headroom), drawn from seed + 300."""
    if demo.skip_fraction == 0 and demo.answer_slip_rate == 0:
        return None
    return warm_start_responses(
        records,
        skip_fraction=demo.skip_fraction,
        skip_min_steps=demo.skip_min_steps,
        seed=seed + 300,
        answer_slip_rate=demo.answer_slip_rate,
    )


def meets(check: tuple[int, float, float], target: float, target_spearman: float | None) -> bool:
    """Whether a warm-start check ``(step, reward, spearman)`` reaches the target reward and length tracking (a NaN
    Spearman, from constant lengths, never does)."""
    _, reward, rho = check
    return reward >= target and (target_spearman is None or rho >= target_spearman)


def check_policy(
    model: Any,
    tokenizer: Any,
    evaluation: PolicyEvalParams,
    seed: int,
    num_threads: int | None,
    records: list[dict] | None = None,
) -> dict[str, Any]:
    """Sample the policy on `records` (None: `evaluation.prompts` fresh demo problems): length Spearman, mean
    reward, ... (`asp.demo.policy.evaluate_policy`)."""
    from asp.demo.policy import evaluate_policy

    return evaluate_policy(
        model,
        tokenizer,
        records if records is not None else generate_problems(evaluation.prompts, seed=seed + 200),
        n_samples=evaluation.samples,
        temperature=evaluation.temperature,
        max_new_tokens=evaluation.max_new_tokens,
        seed=seed,
        batch_size=evaluation.batch_size,
        num_threads=num_threads,
    )


def build_demo_policy(policy: PolicyParams, seed: int, model_dir: Path) -> tuple[dict[str, float], WarmStart]:
    """Build, warm-start, save and check the demo policy; return its metrics and the warm start's record."""
    warm = warm_started_policy(policy.demo, policy.eval, seed)
    warm.model.save_pretrained(model_dir, safe_serialization=True)
    warm.tokenizer.save_pretrained(model_dir)
    check = check_policy(warm.model, warm.tokenizer, policy.eval, seed, policy.demo.num_threads)
    target = {}
    if warm.reached is not None:
        target = {
            "policy/warm_start_checks": float(len(warm.checks)),
            "policy/validation_reward": warm.checks[-1][1],
            "policy/validation_spearman": warm.checks[-1][2],
            "policy/target_reached": float(warm.reached),
        }
    return {
        "policy/warm_start_s": warm.seconds,
        "policy/warm_start_steps": float(warm.steps),
        "policy/final_loss": float(warm.losses[-1]) if warm.losses else float("nan"),
        **target,
        **{f"policy/{k}": float(v) for k, v in check.items() if isinstance(v, int | float)},
    }, warm


@dataclass(frozen=True)
class CheckpointRecord:
    """What `policy.json` records: the checkpoint path later stages load, its source and content hash."""

    model_path: Path
    source: str
    sha256: str

    def to_dict(self) -> dict[str, str]:
        return {"model_path": str(self.model_path), "source": self.source, "sha256": self.sha256}


def checkpoint_mb(path: Path) -> float:
    """Size of everything under `path` in MiB (directory entries included, as `stat` reports them)."""
    return sum(f.stat().st_size for f in path.rglob("*")) / 2**20


def make_policy(
    policy: PolicyParams, seed: int, out: Path, final_out: Path
) -> tuple[CheckpointRecord, dict[str, float], WarmStart | None]:
    """Build the demo policy under `out` (recorded as `final_out`) or check the user's path; hash it.

    Returns the record, the metrics (with `policy/checkpoint_mb`) and the warm start (None for a path).
    """
    warm: WarmStart | None = None
    if policy.source == "build":
        metrics, warm = build_demo_policy(policy, seed, out / "model")
        files, recorded = out / "model", final_out / "model"  # relative: the repo may be cloned elsewhere
    else:
        if not policy.path:  # PolicyParams refuses this already (source 'path' without a path)
            raise UserError("policy.source is 'path' but no policy.path is set; give the local checkpoint directory")
        metrics = {}
        files = recorded = check_checkpoint(policy.path)
    record = CheckpointRecord(recorded, policy.source, content_hash(files))
    metrics["policy/checkpoint_mb"] = checkpoint_mb(files)
    return record, metrics, warm


def log_policy(tracker: Tracker, metrics: dict[str, Any], warm: WarmStart | None, record: CheckpointRecord) -> None:
    """The warm-start loss and validation-reward curves, the metrics and the checkpoint's hash and path as tags."""
    for step, loss in enumerate(warm.losses if warm else []):
        tracker.log_metrics({"policy/warm_start_loss": loss}, step=step)
    for step, reward, rho in warm.checks if warm else []:
        tracker.log_metrics(
            {"policy/warm_start_validation_reward": reward, "policy/warm_start_validation_spearman": rho}, step=step
        )
    tracker.log_metrics(metrics)
    tracker.set_tags({"policy.sha256": record.sha256, "policy.path": str(record.model_path)})


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Build (demo) or record (cluster) the policy checkpoint and write `policy.json`."""
    policy, seed = params.policy, params.common.seed
    tracker.log_params({"policy": policy.model_dump(), "common.seed": seed})
    with atomic_path(paths.out_dir) as out:
        out.mkdir(parents=True)
        record, metrics, warm = make_policy(policy, seed, out, paths.out_dir)
        write_json(record.to_dict(), out / "policy.json")
    write_json(metrics, paths.metrics)
    log_policy(tracker, metrics, warm, record)
    return metrics
