"""Named GPU/NPU time-model presets: generation and training times from published measurements (pure, no I/O).

Where the pipeline cannot time the hardware a user plans for, the simulator needs time models that come from
somewhere other than an assumption. A `TimeModelPreset` is a continuous-batching (vLLM) `GenerationTimeModel` for
one generation actor plus a `TrainingTimeModel` for a Training Unit of ``tu_devices`` devices, and, for every
coefficient, a `Source`: the published number it comes from, the setup and date of that measurement, how the
coefficient was derived, and whether it is *extrapolated* (derived for another model size, device or batch than
the one measured). docs/simulator.md ("Time-model presets") prints the same table.

Derivations (the arithmetic is in `_derive_*` below, so a reader can redo it):

* decode cost per step and per active sequence: a decode step of a continuous-batching engine costs
  ``TPOT(B) = per_step + per_sequence * B`` at B concurrent sequences; two published TPOT points at different
  concurrencies give both. Summed over a minibatch, the steps are the longest response (``decode_steps``) and
  the sequence-steps are its generated tokens (``generated_tokens``), so the two coefficients are exactly
  ``per_step`` and ``per_sequence``.
* other model sizes on the same GPU: decode is memory-bound, so the per-step cost is a fixed launch overhead
  plus reading the weights once at the GPU's published HBM bandwidth; the per-sequence cost scales with the
  parameters a token touches (extrapolated).
* trainer step: a GRPO step costs ``10 N`` FLOPs per token (policy forward + backward 6 N, old-policy and
  reference log-probabilities 2 N each) at a published model-FLOPs utilisation of the GPU's BF16 peak
  (extrapolated from pre-training MFU to an RL trainer).
* weight refresh: the ASP paper's measured reload, export and conversion times per GiB of weights, scaled by
  the model's weight bytes (extrapolated from its Ascend prototype to GPUs; pessimistic next to NCCL broadcast).

Usage: ``get_preset("h100-qwen3-8b")``; ``simulate.time_model`` names one in params (asp.config), and
``scaled_models`` gives the models of one point of the sensitivity grid (``SENSITIVITY_GRID``).

Run the tests with ``.venv/bin/python -m pytest tests/sim/test_presets.py -q``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

from asp.sim.timemodel import FEATURES, GenerationTimeModel, TrainingTimeModel

# --- published numbers (each used below; docs/simulator.md cites them) ---------------------------------------------
# yobitelcomm InferenceBench "concurrency sweep" recipe: Llama-3.1-8B-Instruct, one H100-80GB-HBM3, vLLM 0.21.0,
# fp16, chatbot-short workload, captured 2026-05-16; median TPOT 6.48 ms at concurrency 1, 10.94 ms at 16.
H100_8B_TPOT_MS = {1: 6.48, 16: 10.94}
H100_HBM_BYTES_PER_S = 3.35e12  # NVIDIA H100 SXM5 datasheet: 3.35 TB/s HBM3
H100_BF16_PEAK_FLOPS = 989e12  # NVIDIA H100 SXM5 datasheet: 989 TFLOPS dense BF16
H100_MFU = 0.40  # Llama 3 paper (Dubey et al., 2024), Table 4: 38-43 % BF16 MFU on H100 pre-training
# ASP paper (asp-adaptive-scheduling-pipeline.md), Qwen3-30B-A3B on Ascend 910B3 nodes, vLLM 0.9.1:
PAPER_T_LOAD_S, PAPER_T_SAVE_S, PAPER_T_CONVERT_S = 73.9, 23.5, 84.6  # App. D.5 (1 TU node + 3 GU nodes)
PAPER_T_TRAIN_8_S = 287.6  # App. D.5: Training Unit step on one node (8 NPUs, recomputation + offload)
PAPER_ITER_128_S = 147.0  # Sec. 5.4: 128 NPUs (48 training), training-bound: the step at 48 NPUs is <= this
PAPER_VLLM_TPS_PER_NPU = {"scheduled": 126.0, "unscheduled": 106.0}  # App. F.6.1, Figure 9 (TP 2 actors)
QWEN3_30B_A3B_WEIGHT_GB = 61.06  # BF16 safetensors, 30.5 B params (1e9 bytes)
PARAM_B = {"qwen2.5-1.5b": 1.54, "qwen2.5-7b": 7.62, "llama3.1-8b": 8.03, "qwen3-8b": 8.19, "qwen3-30b-a3b": 30.5}
ACTIVE_B = {"qwen3-30b-a3b": 3.3}  # parameters a token touches (3.3 B active of 30.5 B, Qwen3 model card)


PER_SAMPLE = "step_per_sample_s"  # the trainer's per-sequence cost: 0 in every preset (FLOPs are per token)


@dataclass(frozen=True)
class Source:
    """Where one coefficient comes from.

    Attributes:
        coefficient: the `GenerationTimeModel` feature or `TrainingTimeModel` field it sets.
        value: the coefficient (seconds per unit).
        source: publication / page the number comes from; setup: hardware, software, model, workload; date: of
            the measurement or publication; derivation: how the coefficient follows from it.
        extrapolated: True when the measurement was of another model, device, batch or software than the preset.
    """

    coefficient: str
    value: float
    source: str
    setup: str
    date: str
    derivation: str
    extrapolated: bool


@dataclass(frozen=True)
class TimeModelPreset:
    """A named time model of one generation actor (``devices_per_actor`` devices) and a Training Unit of
    ``tu_devices`` devices, with a `Source` for every coefficient."""

    name: str
    description: str
    gen: GenerationTimeModel
    train: TrainingTimeModel
    devices_per_actor: int
    tu_devices: int
    sources: tuple[Source, ...]

    def __post_init__(self) -> None:
        covered = {s.coefficient for s in self.sources}
        needed = set(FEATURES["continuous"]) | {k for k, v in self.train.to_dict().items() if v or k != PER_SAMPLE}
        if covered != needed:
            raise ValueError(f"preset {self.name!r}: sources must cover {sorted(needed)}, got {sorted(covered)}")

    @property
    def extrapolated(self) -> list[str]:
        """Coefficients derived for another setting than the one measured."""
        return [s.coefficient for s in self.sources if s.extrapolated]


def _gen(intercept: float, per_step: float, per_seq: float, prefill: float, kv: float) -> GenerationTimeModel:
    return GenerationTimeModel("continuous", (intercept, per_step, per_seq, prefill, kv), FEATURES["continuous"])


def _derive_h100_8b() -> tuple[float, float]:
    """(per_step, per_sequence) seconds from the two TPOT points: TPOT(B) = per_step + per_sequence * B."""
    (b1, t1), (b2, t2) = sorted(H100_8B_TPOT_MS.items())
    per_seq = (t2 - t1) / (b2 - b1) / 1e3
    return t1 / 1e3 - per_seq * b1, per_seq


def _derive_h100_dense(params_b: float, active_b: float | None = None, tp: int = 1) -> tuple[float, float]:
    """(per_step, per_sequence) for another model on H100: the 8B measurement's launch overhead (its per-step cost
    minus reading its weights at HBM bandwidth) plus reading this model's weights (split over `tp` GPUs); the
    per-sequence cost scaled by the parameters a token touches."""
    step_8b, seq_8b = _derive_h100_8b()
    overhead = step_8b - 2 * PARAM_B["llama3.1-8b"] * 1e9 / H100_HBM_BYTES_PER_S
    per_step = overhead + 2 * params_b * 1e9 / tp / H100_HBM_BYTES_PER_S
    return per_step, seq_8b * (active_b if active_b is not None else params_b) / PARAM_B["llama3.1-8b"]


def _h100_train_per_token(params_b: float, devices: int) -> float:
    """Seconds per response token of a GRPO step: 10 N FLOPs per token at H100_MFU of `devices` GPUs' peak."""
    return 10 * params_b * 1e9 / (devices * H100_MFU * H100_BF16_PEAK_FLOPS)


def _refresh(weight_gb: float) -> tuple[float, float]:
    """(save_s, load_s) scaled from the ASP paper's T_save and T_load by weight bytes."""
    return PAPER_T_SAVE_S * weight_gb / QWEN3_30B_A3B_WEIGHT_GB, PAPER_T_LOAD_S * weight_gb / QWEN3_30B_A3B_WEIGHT_GB


def _paper_tu_step(devices: int) -> float:
    """The paper's TU step at `devices` NPUs: Amdahl t(d) = t(8) (s + (1 - s) 8 / d) through its two points
    (8 NPUs: 287.6 s measured; 48 NPUs: the 147 s training-bound iteration)."""
    s = (PAPER_ITER_128_S / PAPER_T_TRAIN_8_S - 8 / 48) / (1 - 8 / 48)
    return PAPER_T_TRAIN_8_S * (s + (1 - s) * 8 / devices)


_VLLM_SWEEP = (
    "yobitelcomm.github.io/bench/recipes/concurrency-sweep (InferenceBench)",
    "1x H100-80GB-HBM3, vLLM 0.21.0, fp16, Llama-3.1-8B-Instruct, chatbot-short; median TPOT 6.48 ms at "
    "concurrency 1, 10.94 ms at 16",
    "2026-05-16",
)
_H100_SHEET = ("NVIDIA H100 SXM5 datasheet", "H100 SXM5 80 GB: 3.35 TB/s HBM3, 989 TFLOPS dense BF16", "2023")
_LLAMA3_MFU = ("The Llama 3 Herd of Models (Dubey et al.), Table 4", "Llama 3 405B pre-training on H100: 38-43 % "
               "BF16 MFU", "2024-07")  # fmt: skip
_ASP_D5 = (
    "ASP paper, App. D.5 (and C.5)",
    "Qwen3-30B-A3B, Ascend 910B3, MindSpeed-RL + vLLM 0.9.1, 1 TU node + 3 GU nodes: T_save 23.5 s, "
    "T_convert 84.6 s, T_load 73.9 s, T_train 287.6 s",
    "paper (n.d.)",
)
_NOT_MODELLED = "0: not separated from the per-step cost in any source used here"


def _h100_preset(name: str, model: str, params_b: float, active_b: float | None, tp: int, tu: int) -> TimeModelPreset:
    per_step, per_seq = _derive_h100_8b() if model == "llama3.1-8b" else _derive_h100_dense(params_b, active_b, tp)
    weight_gb = 2 * params_b
    save_s, load_s = _refresh(weight_gb)
    per_token = _h100_train_per_token(active_b or params_b, tu)
    measured = model == "llama3.1-8b"
    step_how = (
        "per_step = TPOT(1) - per_seq; per_seq = (TPOT(16) - TPOT(1)) / 15"
        if measured
        else f"8B's launch overhead ({1e3 * (_derive_h100_8b()[0] - 16.06e9 / H100_HBM_BYTES_PER_S):.2f} ms) + "
        f"{weight_gb:.1f} GB / {tp} GPU(s) at 3.35 TB/s"
    )
    seq_how = "from the two TPOT points" if measured else f"8B's per-sequence cost x {active_b or params_b} / 8.03"
    sources = (
        Source("intercept", 0.0, "-", "-", "-", _NOT_MODELLED + " (per-call overhead)", False),
        Source("decode_steps", per_step, *_VLLM_SWEEP, step_how, not measured),
        Source("generated_tokens", per_seq, *_VLLM_SWEEP, seq_how, not measured),
        Source("prefill_tokens", 0.0, *_VLLM_SWEEP, "0: TTFT 14 ms at concurrency 1 in the same sweep, < 0.1 % "
               "of a decode of thousands of steps", False),  # fmt: skip
        Source("kv_reads", 0.0, "-", "-", "-", _NOT_MODELLED + " (in the per-sequence cost)", False),
        Source("step_base_s", 0.0, "-", "-", "-", _NOT_MODELLED + " (optimizer, rewards)", False),
        Source("step_per_token_s", per_token, f"{_H100_SHEET[0]}; {_LLAMA3_MFU[0]}",
               f"{_H100_SHEET[1]}; {_LLAMA3_MFU[1]}", "2023 / 2024-07",
               f"10 x {active_b or params_b} G (active) FLOPs/token / ({tu} GPUs x 0.40 x 989 TFLOPS)", True),
        Source("save_s", save_s, *_ASP_D5, f"T_save x {weight_gb:.1f} / 61.06 GB", True),
        Source("convert_s", 0.0, *_ASP_D5, "0: the paper converts generation-side, off the trainer's step", False),
        Source("load_s", load_s, *_ASP_D5, f"T_load x {weight_gb:.1f} / 61.06 GB", True),
    )  # fmt: skip
    return TimeModelPreset(
        name=name,
        description=f"H100 SXM, {model} (BF16), vLLM actor on {tp} GPU(s), GRPO Training Unit of {tu} GPUs",
        gen=_gen(0.0, per_step, per_seq, 0.0, 0.0),
        train=TrainingTimeModel(
            step_base_s=0.0,
            step_per_token_s=per_token,
            save_s=save_s,
            convert_s=0.0,
            load_s=load_s,
            step_per_sample_s=0.0,
        ),
        devices_per_actor=tp,
        tu_devices=tu,
        sources=sources,
    )


PAPER_PRESET = "ascend910b3-qwen3-30b-a3b"
# the paper's per-step cost is not published separately: its share is the 8B H100 sweep's ratio (extrapolated);
# `benchmarks/sim_paper.py` scales both so that the C4 schedule's simulated vLLM throughput is the paper's
# 126 tokens/s/NPU (App. F.6.1) and prints the result; these are its output (--calibrate prints them again)
PAPER_PER_STEP_S = 0.04531
PAPER_PER_SEQ_S = PAPER_PER_STEP_S * _derive_h100_8b()[1] / _derive_h100_8b()[0]


def _paper_preset() -> TimeModelPreset:
    tu = 32
    step = _paper_tu_step(tu)
    f61 = (
        "ASP paper, App. F.6.1 (Figure 9)",
        "Qwen3-30B-A3B on DeepScaleR, 16 vLLM actors of TP 2 on 910B3: 126 (scheduled) / 106 (unscheduled) "
        "generated tokens/s/NPU",
        "paper (n.d.)",
    )
    sources = (
        Source("intercept", 0.0, "-", "-", "-", _NOT_MODELLED, False),
        Source("decode_steps", PAPER_PER_STEP_S, *f61, "scaled (with generated_tokens) so the C4 schedule's "
               "simulated throughput is 126 tokens/s/NPU: benchmarks/sim_paper.py --calibrate", False),
        Source("generated_tokens", PAPER_PER_SEQ_S, *_VLLM_SWEEP, "per-step cost x the H100 8B sweep's "
               "per_seq / per_step ratio (the paper gives no concurrency sweep)", True),
        Source("prefill_tokens", 0.0, "-", "-", "-", _NOT_MODELLED, False),
        Source("kv_reads", 0.0, "-", "-", "-", _NOT_MODELLED, False),
        Source("step_base_s", step, "ASP paper, App. D.5 + Sec. 5.4", "T_train 287.6 s on 8 NPUs; 147 s "
               "training-bound iteration with 48 training NPUs", "paper (n.d.)",
               f"Amdahl through both points, at {tu} NPUs (the main run's TU)", True),
        Source("step_per_token_s", 0.0, "-", "-", "-", "0: the paper reports step times at one batch only", False),
        Source("save_s", 0.0, *_ASP_D5, "0: T_train (287.6 s) is taken to include the export (its 1+3-node run "
               "iterates in 288 s)", False),
        Source("convert_s", 0.0, *_ASP_D5, "0: converted generation-side, overlapping the next step", False),
        Source("load_s", PAPER_T_LOAD_S, *_ASP_D5, "T_load as measured", False),
    )  # fmt: skip
    return TimeModelPreset(
        name=PAPER_PRESET,
        description="ASP paper's setup: Ascend 910B3, Qwen3-30B-A3B, vLLM actors of 2 NPUs, a 32-NPU Training Unit",
        gen=_gen(0.0, PAPER_PER_STEP_S, PAPER_PER_SEQ_S, 0.0, 0.0),
        train=TrainingTimeModel.simulated(step, PAPER_T_LOAD_S),  # a fixed step and reload, no export
        devices_per_actor=2,
        tu_devices=tu,
        sources=sources,
    )


PRESETS: MappingProxyType[str, TimeModelPreset] = MappingProxyType(
    {
        p.name: p
        for p in (
            _h100_preset("h100-qwen2.5-1.5b", "qwen2.5-1.5b", PARAM_B["qwen2.5-1.5b"], None, 1, 8),
            _h100_preset("h100-qwen2.5-7b", "qwen2.5-7b", PARAM_B["qwen2.5-7b"], None, 1, 8),
            _h100_preset("h100-llama3.1-8b", "llama3.1-8b", PARAM_B["llama3.1-8b"], None, 1, 8),
            _h100_preset("h100-qwen3-8b", "qwen3-8b", PARAM_B["qwen3-8b"], None, 1, 8),
            _h100_preset("h100-qwen3-30b-a3b", "qwen3-30b-a3b", PARAM_B["qwen3-30b-a3b"], 3.3, 2, 8),
            _paper_preset(),
        )
    }
)  # fmt: skip
FIT = "fit"  # simulate.time_model's value for "fit the pipeline's own timings" (the default)


def get_preset(name: str) -> TimeModelPreset:
    """The preset called `name`; ValueError naming the valid ones otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown time-model preset {name!r}; valid: {', '.join(PRESETS)} (or {FIT!r})") from None


@dataclass(frozen=True)
class Scale:
    """Multipliers of one sensitivity point: decode cost per step and per sequence-step, trainer, reload."""

    step: float = 1.0
    token: float = 1.0
    train: float = 1.0
    reload: float = 1.0

    @property
    def label(self) -> str:
        parts = [f"{k} x{v:g}" for k, v in vars(self).items() if v != 1.0]
        return ", ".join(parts) or "preset"


# one-at-a-time extremes of the plausible range plus the corners that move the bottleneck (a coarse version of
# the full 3^4 grid; decode per step / per token x0.5-2, trainer x0.5-2, reload x0.5-4)
SENSITIVITY_GRID: tuple[Scale, ...] = (
    Scale(),
    Scale(step=0.5), Scale(step=2.0),
    Scale(token=0.5), Scale(token=2.0),
    Scale(train=0.5), Scale(train=2.0),
    Scale(reload=0.5), Scale(reload=4.0),
    Scale(step=2.0, token=2.0, train=0.5),
    Scale(step=0.5, token=0.5, train=2.0),
    Scale(step=0.5, token=0.5, train=0.5, reload=0.5),
    Scale(step=2.0, token=2.0, train=2.0, reload=4.0),
)  # fmt: skip


def scaled_models(
    gen: GenerationTimeModel, train: TrainingTimeModel, scale: Scale
) -> tuple[GenerationTimeModel, TrainingTimeModel]:
    """`gen` and `train` with the cost multipliers of `scale`: ``decode_steps`` x step, ``generated_tokens`` and
    ``kv_reads`` x token (or ``row_steps`` for the static form), the trainer's step (base and per token) x train,
    ``load_s`` x reload (export and conversion unchanged)."""
    factor = {
        "decode_steps": scale.step,
        "generated_tokens": scale.token,
        "row_steps": scale.token,
        "kv_reads": scale.token,
    }
    coef = tuple(c * factor.get(name, 1.0) for name, c in zip(gen.feature_names, gen.coef, strict=True))
    new_train = replace(
        train,
        step_base_s=train.step_base_s * scale.train,
        step_per_token_s=train.step_per_token_s * scale.train,
        step_per_sample_s=train.step_per_sample_s * scale.train,
        load_s=train.load_s * scale.reload,
    )
    return GenerationTimeModel(gen.form, coef, gen.feature_names), new_train
