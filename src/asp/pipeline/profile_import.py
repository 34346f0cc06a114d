"""The `profile` stage with `profile.source: file`: bring your own lengths instead of generating them.

Reads the rollouts at `profile.lengths.path` (`asp.io.lengths`: JSONL / JSON / Parquet / CSV, field names from
`profile.lengths`), keeps the responses of the prompts prepare chose to profile and hold out, and returns them as the
samples the generating path would have produced (prompt_id, role, sample, length, finish_reason). The stage
(`asp.pipeline.profile.run_from_file`) writes them exactly as it writes generated ones: outputs/profile/
(samples.parquet, prompts.parquet), metrics/profile.json and plots/profile_lengths.png. No minibatch is generated,
so metrics/profile_timings.csv holds the header only, and the simulate stage, which fits generation times on it,
says so and is skipped (docs/lengths.md).

Response text is counted with the policy's tokenizer (outputs/policy), so lengths are in the policy's tokens.

Run: `asp stage profile` with `profile.source: file` (what `dvc repro profile` calls); dvc.yaml makes
`${profile.lengths.path}` a dependency of the stage, so a changed lengths file re-runs profile and what follows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from asp.config import Params
from asp.errors import UserError
from asp.io.lengths import ROLES, match_samples, parse_records, read_rollouts
from asp.steps.loaders import load_policy_tokenizer


def prepared_prompts(prompts_dir: Path) -> pd.DataFrame:
    """Every prepared prompt (prompt_id, problem, prompt, role): the profiling and held-out ones first, in the
    profile stage's order, then those prepare keeps for training only (role 'train')."""
    frames = []
    for role in (*ROLES, "train"):
        path = prompts_dir / f"{role}.parquet"
        if not path.is_file():
            raise UserError(f"{path}: missing. Run the prepare stage first (`dvc repro prepare`).")
        frames.append(pd.read_parquet(path, columns=["prompt_id", "problem", "prompt"]).assign(role=role))
    frame = pd.concat(frames, ignore_index=True)
    return frame[~frame["prompt_id"].duplicated(keep="first")].reset_index(drop=True)  # train holds all of them


def token_counter(policy_dir: Path) -> Callable[[list[str]], list[int]]:
    """Texts -> their lengths in the policy's tokens (no special tokens added, as the engines count responses)."""
    tokenizer = load_policy_tokenizer(policy_dir)

    def count(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]]

    return count


def import_samples(params: Params, prompts_dir: Path, policy_dir: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The samples of the lengths file for the prepared prompts, and metrics of what was read and matched.

    Raises:
        UserError: a bad record (named by file and row), or no overlap with the prepared prompts.
    """
    spec, cap = params.profile.lengths, params.profile.max_new_tokens
    prompts = prepared_prompts(prompts_dir)
    records = read_rollouts(spec.path)
    count = token_counter(policy_dir) if spec.response_field else None
    responses = parse_records(records, spec, cap, count)
    samples, report = match_samples(responses, prompts, spec.path, spec.match)
    return samples, {f"profile/file_{k}": v for k, v in report.items()}
