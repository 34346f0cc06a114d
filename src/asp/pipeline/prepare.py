"""`prepare` stage: load prompts, check rows, apply the policy's chat template, split, write Parquet.

Inputs: a DeepScaleR-style JSON / JSONL / Parquet file (records with `problem`, `answer`, ...) or the
built-in demo task (`prepare.dataset: builtin:demo-arith`). Outputs (Parquet, columns prompt_id, problem,
answer, prompt[, steps]): `train.parquet` (every valid prompt, the RL dataset), `profile.parquet` (the
subset profiled to train the length predictor) and `heldout.parquet` (profiled, kept aside to evaluate it);
profile and heldout are disjoint subsets of train.

Run: `asp stage prepare` (what `dvc repro prepare` calls).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from asp.config import DEMO_DATASET, Params, PrepareParams
from asp.errors import UserError
from asp.io import write_json, write_parquet
from asp.pipeline.loaders import load_policy_tokenizer
from asp.tracking import Tracker


@dataclass(frozen=True)
class Paths:
    policy: Path = Path("outputs/policy")
    out_dir: Path = Path("outputs/prompts")
    metrics: Path = Path("metrics/prepare.json")


def read_records(path: str | Path) -> pd.DataFrame:
    """Read prompt records from a .json (list of objects), .jsonl or .parquet file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: dataset file not found. Set prepare.dataset to an existing JSON/JSONL/Parquet file.")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix == ".jsonl":
        rows = []
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}: line {lineno} is not valid JSON ({exc.msg}). Fix or remove it.") from None
        return _frame(rows, path)
    if suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}).") from None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        return _frame(data, path)
    raise UserError(f"{path}: unsupported file type '{suffix}'. Use .json (a list of objects), .jsonl or .parquet.")


def _frame(rows: Any, path: Path) -> pd.DataFrame:
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise UserError(f"{path}: expected a list of JSON objects (one per prompt).")
    return pd.DataFrame.from_records(rows)


def demo_records(n: int, seed: int) -> pd.DataFrame:
    """The built-in demo task's prompts, in the same record shape as DeepScaleR."""
    from asp.demo.task import generate_problems

    return pd.DataFrame.from_records(generate_problems(n, seed=seed))


def clean_rows(df: pd.DataFrame, prep: PrepareParams, source: str) -> tuple[pd.DataFrame, dict[str, int]]:
    """Check every row; raise on the first bad one (bad_rows=error) or drop and count them (drop).

    Returns the clean frame with columns prompt_id, problem, answer[, steps] and the drop counts.
    """
    for field in (prep.problem_field, prep.answer_field) + ((prep.id_field,) if prep.id_field else ()):
        if field not in df.columns:
            raise UserError(
                f"{source}: no '{field}' field in any record (fields present: {', '.join(map(str, df.columns))}). "
                "Set prepare.problem_field / answer_field / id_field to the right names."
            )
    ids = df[prep.id_field].astype(str) if prep.id_field else pd.Series([f"p{i:07d}" for i in range(len(df))])
    problem, answer = df[prep.problem_field], df[prep.answer_field]
    reasons = pd.Series("", index=df.index, dtype=object)
    reasons[answer.isna()] = f"missing '{prep.answer_field}'"
    bad_problem = problem.isna() | ~problem.map(lambda v: isinstance(v, str) and bool(v.strip()))
    reasons[bad_problem] = f"empty or missing '{prep.problem_field}'"
    dup = ids.duplicated(keep="first").to_numpy() & (reasons == "").to_numpy()
    reasons[dup] = "duplicate id"
    bad = reasons != ""
    if bad.any() and prep.bad_rows == "error":
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise UserError(
            f"{source}: row {i} (id {ids.iloc[i]!r}) is invalid: {reasons.iloc[i]}. Fix the row, or set "
            "prepare.bad_rows: drop to drop such rows and count them."
        )
    counts = {k.split(" '")[0].replace(" ", "_"): int(v) for k, v in reasons[bad].value_counts().items()}
    out = pd.DataFrame({"prompt_id": ids, "problem": problem.astype(object), "answer": answer.astype(str)})
    if "steps" in df.columns:
        out["steps"] = df["steps"].astype("int64")
    out = out[~bad.to_numpy()].reset_index(drop=True)
    return out, {"dropped": int(bad.sum()), **{f"dropped_{k}": v for k, v in counts.items()}}


def format_prompts(problems: list[str], tokenizer: Any, use_template: bool, system_prompt: str | None) -> list[str]:
    """Apply the tokenizer's chat template (generation prompt added) when it has one, else keep the text."""
    if not use_template or tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return [f"{system_prompt}\n\n{p}" if system_prompt else p for p in problems]
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []
    chats = [head + [{"role": "user", "content": p}] for p in problems]
    return [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]


def split_roles(n: int, n_profile: int, n_heldout: int, seed: int) -> np.ndarray:
    """Seeded role per row: 'profile', 'heldout' or 'train' (profile and heldout are disjoint)."""
    if n_profile + n_heldout > n:
        raise UserError(
            f"prepare.profile_prompts + prepare.heldout_prompts = {n_profile + n_heldout} exceeds the {n} valid "
            "prompts; lower them or use a larger dataset."
        )
    order = np.random.default_rng(seed).permutation(n)
    roles = np.full(n, "train", dtype=object)
    roles[order[:n_profile]] = "profile"
    roles[order[n_profile : n_profile + n_heldout]] = "heldout"
    return roles


def load_raw(prep: PrepareParams, seed: int) -> tuple[pd.DataFrame, str]:
    """The raw records of `prepare.dataset` (the built-in demo task or a file) and the name of their source."""
    if prep.dataset == DEMO_DATASET:
        return demo_records(prep.demo_prompts, seed=seed + 1), DEMO_DATASET
    return read_records(prep.dataset), prep.dataset


def build_prompts(
    raw: pd.DataFrame, prep: PrepareParams, source: str, policy_dir: Path
) -> tuple[pd.DataFrame, dict[str, int], bool]:
    """Clean the rows, keep at most `prepare.max_prompts` and add the `prompt` column (chat template applied).

    Returns the frame, the drop counts and whether the policy's chat template was applied.
    """
    df, counts = clean_rows(raw, prep, source)
    if prep.max_prompts is not None:
        df = df.iloc[: prep.max_prompts].reset_index(drop=True)
    tokenizer = load_policy_tokenizer(policy_dir) if prep.chat_template else None
    templated = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    df["prompt"] = format_prompts(df["problem"].tolist(), tokenizer, prep.chat_template, prep.system_prompt)
    return df, counts, templated


def save_splits(df: pd.DataFrame, roles: np.ndarray, out_dir: Path) -> None:
    """`train.parquet` (every prompt), `profile.parquet` and `heldout.parquet` (their roles' rows)."""
    write_parquet(df, out_dir / "train.parquet")
    write_parquet(df[roles == "profile"].reset_index(drop=True), out_dir / "profile.parquet")
    write_parquet(df[roles == "heldout"].reset_index(drop=True), out_dir / "heldout.parquet")


def prepare_metrics(
    df: pd.DataFrame, n_raw: int, roles: np.ndarray, templated: bool, counts: dict[str, int]
) -> dict[str, Any]:
    """Prompt counts per role, prompt characters, whether templated and the dropped-row counts."""
    chars = df["prompt"].str.len()
    return {
        "prepare/prompts": len(df),
        "prepare/raw_rows": n_raw,
        "prepare/profile_prompts": int((roles == "profile").sum()),
        "prepare/heldout_prompts": int((roles == "heldout").sum()),
        "prepare/prompt_chars_mean": float(chars.mean()),
        "prepare/prompt_chars_max": int(chars.max()),
        "prepare/chat_template_applied": int(templated),
        **{f"prepare/{k}": v for k, v in counts.items()},
    }


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Load, clean, template and split the prompts; write Parquet and metrics; log to the tracker."""
    prep, seed = params.prepare, params.common.seed
    raw, source = load_raw(prep, seed)
    df, counts, templated = build_prompts(raw, prep, source, paths.policy)
    roles = split_roles(len(df), prep.profile_prompts, prep.heldout_prompts, seed + 2)
    save_splits(df, roles, paths.out_dir)
    metrics = prepare_metrics(df, len(raw), roles, templated, counts)
    write_json(metrics, paths.metrics)
    tracker.log_params({"prepare": prep.model_dump(), "common.seed": seed})
    tracker.log_metrics(metrics)
    return metrics
