"""What the sharing probe (`asp simulate probe-sharing`) and the trainer_alone stage time: the launch's GRPO trainer
at learning rate 0 (every step the same work on the same weights) on the first profile prompts, with their answers.

    texts, answers = first_profile_prompts(Path("outputs/prompts/profile.parquet"), 16)
    factory = timing_trainer_factory(params, RuntimeConfig.from_params(params), policy_path, texts, answers)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from asp.config import Params
from asp.errors import UserError


def first_profile_prompts(path: Path, prompts: int) -> tuple[list[str], list[str]]:
    """The texts and answers of the first `prompts` profile prompts (answers '' without an answer column).

    Raises:
        UserError: the file is missing (the prepare stage has not run).
    """
    if not path.is_file():
        raise UserError(f"{path}: missing. Run the prepare stage first (`dvc repro prepare`).")
    frame = pd.read_parquet(path).head(prompts)
    answers = frame["answer"].astype(str).tolist() if "answer" in frame.columns else [""] * len(frame)
    return frame["prompt"].tolist(), answers


def timing_trainer_factory(
    params: Params, runtime: Any, policy_path: Path, texts: list[str], answers: list[str]
) -> Any:
    """The launch's GRPO trainer factory (``runtime.grpo``) at learning rate 0 and a constant schedule, knowing the
    prompts `texts` by their positions (`model_copy`: the params validate lr > 0)."""
    from asp.trainers import make_trainer_factory

    return make_trainer_factory(
        "grpo",
        runtime,
        policy_path=policy_path,
        prompts=dict(enumerate(texts)),
        answers=dict(enumerate(answers)),
        grpo=params.runtime.grpo.model_copy(update={"lr": 0.0, "lr_schedule": "constant"}),
        dataset=params.prepare.dataset,
        state_dir=None,
    )
