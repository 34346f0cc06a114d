"""`prepare` stage: load prompts, check rows, apply the policy's chat template, split, write Parquet.

Inputs: a DeepScaleR-style JSON / JSONL / Parquet file (records with `problem`, `answer`, ...) or the
built-in demo task (`prepare.dataset: builtin:demo-arith`). Outputs (Parquet, columns prompt_id, problem,
answer, prompt[, steps]): `train.parquet` (every valid prompt, the RL dataset), `profile.parquet` (the
subset profiled to train the length predictor) and `heldout.parquet` (profiled, kept aside to evaluate it);
profile and heldout are disjoint subsets of train.

Bad input is caught here, not minutes later in `profile`: a file that is not UTF-8 or not readable Parquet, rows
without a problem or answer, duplicate ids, and prompts (chat template applied) longer than the policy's context
allows: max_position_embeddings minus the longest response the pipeline asks for (the larger of
profile.max_new_tokens and runtime.sampling.max_new_tokens). `prepare.bad_rows: error` stops with the rows / ids named;
`drop` drops them and counts them in metrics/prepare.json (`prepare/dropped_too_long` for the long prompts).

Run: `asp stage prepare` (what `dvc repro prepare` calls).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from asp.config import DEMO_DATASET, Params, PrepareParams
from asp.demo.task import generate_problems
from asp.errors import UserError
from asp.io import read_user_json, read_user_jsonl, write_json, write_parquet
from asp.steps.loaders import load_policy_tokenizer, policy_context_length
from asp.steps.paths import PreparePaths as Paths
from asp.tracking import Tracker


def read_records(path: str | Path) -> pd.DataFrame:
    """Read prompt records from a .json (list of objects), .jsonl or .parquet file.

    Raises:
        UserError: missing file, unknown type, bytes that are not UTF-8 (JSON/JSONL: line and column named),
            invalid JSON, or a Parquet file that cannot be read (corrupt or truncated).
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: dataset file not found. Set prepare.dataset to an existing JSON/JSONL/Parquet file.")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".jsonl":
        rows = []
        for lineno, row in read_user_jsonl(path):
            if not isinstance(row, dict):
                raise UserError(
                    f"{path}: line {lineno} is a JSON {_json_kind(row)}, not an object; each line must be one prompt "
                    'record such as {"problem": ..., "answer": ...}. Fix or remove it.'
                )
            rows.append(row)
        return _frame(rows, path)
    if suffix == ".json":
        return _frame(read_user_json(path), path)
    raise UserError(f"{path}: unsupported file type '{suffix}'. Use .json (a list of objects), .jsonl or .parquet.")


def _read_parquet(path: Path) -> pd.DataFrame:
    """`pd.read_parquet`, with a corrupt, truncated or non-Parquet file reported as a UserError."""
    import pyarrow as pa

    try:
        return pd.read_parquet(path)
    except (ValueError, OSError, pa.ArrowException) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        reason = reason.split(f"{path}': ", 1)[-1].rstrip(".")  # pyarrow repeats the path: "... '<path>': why"
        raise UserError(
            f"{path}: not a readable Parquet file ({reason}). It may be truncated or corrupt (an interrupted "
            "copy or download): copy or export it again, or point prepare.dataset at a JSON/JSONL file."
        ) from None


def _json_kind(value: Any) -> str:
    names = {str: "string", list: "array", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _frame(rows: Any, path: Path) -> pd.DataFrame:
    if not isinstance(rows, list):
        raise UserError(f"{path}: expected a list of JSON objects (one per prompt), got a JSON {_json_kind(rows)}.")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise UserError(
            f"{path}: record {bad} (0-based) of the list is a JSON {_json_kind(rows[bad])}, not an object; expected a "
            "list of JSON objects (one per prompt). Fix or remove it."
        )
    if rows and not any(rows):
        raise UserError(f"{path}: all {len(rows)} records are empty objects; each needs a problem and an answer.")
    return pd.DataFrame.from_records(rows)


def demo_records(n: int, seed: int) -> pd.DataFrame:
    """The built-in demo task's prompts, in the same record shape as DeepScaleR."""
    return pd.DataFrame.from_records(generate_problems(n, seed=seed))


def clean_rows(df: pd.DataFrame, prep: PrepareParams, source: str) -> tuple[pd.DataFrame, dict[str, int]]:
    """Check every row; raise on the first bad one (bad_rows=error) or drop and count them (drop).

    Returns the clean frame with columns prompt_id, problem, answer[, steps] and the drop counts.
    """
    if len(df) == 0:
        raise UserError(f"{source}: the dataset holds no records. Point prepare.dataset at a file with prompts.")
    for field in (prep.problem_field, prep.answer_field) + ((prep.id_field,) if prep.id_field else ()):
        if field not in df.columns:
            present = f"fields present: {', '.join(map(str, df.columns))}" if len(df.columns) else "records are empty"
            raise UserError(
                f"{source}: no '{field}' field in any record ({present}). "
                "Set prepare.problem_field / answer_field / id_field to the right names."
            )
    ids = df[prep.id_field].astype(str) if prep.id_field else pd.Series([f"p{i:07d}" for i in range(len(df))])
    problem, answer = df[prep.problem_field], df[prep.answer_field]
    reasons = pd.Series("", index=df.index, dtype=object)  # the message per row
    kinds = pd.Series("", index=df.index, dtype=object)  # what is counted: prepare/dropped_<kind>
    reasons[answer.isna()], kinds[answer.isna()] = f"missing '{prep.answer_field}'", "missing"
    issues = pd.Series([_problem_issue(v, prep.problem_field) for v in problem], index=df.index, dtype=object)
    bad_problem = issues != ""
    reasons[bad_problem], kinds[bad_problem] = issues[bad_problem], "empty_or_missing"
    dup = ids.duplicated(keep="first").to_numpy() & (reasons == "").to_numpy()
    reasons[dup], kinds[dup] = "duplicate id", "duplicate_id"
    bad = reasons != ""
    if bad.any() and prep.bad_rows == "error":
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise UserError(
            f"{source}: row {i} (id {ids.iloc[i]!r}) is invalid: {reasons.iloc[i]}. Fix the row, or set "
            "prepare.bad_rows: drop to drop such rows and count them."
        )
    counts = {str(k): int(v) for k, v in kinds[bad].value_counts().items()}
    out = pd.DataFrame({"prompt_id": ids, "problem": problem.astype(object), "answer": answer.astype(str)})
    if "steps" in df.columns:
        out["steps"] = df["steps"].astype("int64")
    out = out[~bad.to_numpy()].reset_index(drop=True)
    return out, {"dropped": int(bad.sum()), **{f"dropped_{k}": v for k, v in counts.items()}}


def _problem_issue(value: Any, field: str) -> str:
    """What is wrong with one record's problem ('' when it is non-empty text)."""
    if isinstance(value, str):
        return "" if value.strip() else f"empty '{field}' (only whitespace)" if value else f"empty '{field}'"
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return f"missing '{field}'"
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return f"'{field}' is {type(value).__name__} {shown}, not text (quote it in the file)"


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
    raw: pd.DataFrame, prep: PrepareParams, source: str, policy_dir: Path, max_new_tokens: int
) -> tuple[pd.DataFrame, dict[str, int], bool]:
    """Clean the rows, add the `prompt` column (chat template applied), check that every prompt fits the policy's
    context with `max_new_tokens` of response, and keep at most `prepare.max_prompts`.

    Returns the frame, the drop / token counts and whether the policy's chat template was applied.
    """
    df, counts = clean_rows(raw, prep, source)
    tokenizer = load_policy_tokenizer(policy_dir)
    templated = prep.chat_template and bool(getattr(tokenizer, "chat_template", None))
    df["prompt"] = format_prompts(df["problem"].tolist(), tokenizer, prep.chat_template, prep.system_prompt)
    context = policy_context_length(policy_dir)
    df, tokens, length_counts = fit_context(df, tokenizer, context, max_new_tokens, prep.bad_rows, source)
    counts = {**counts, "dropped": counts["dropped"] + length_counts["dropped_too_long"], **length_counts}
    if prep.max_prompts is not None:
        df = df.iloc[: prep.max_prompts].reset_index(drop=True)
    if tokens is not None and len(df):
        counts["prompt_tokens_max"] = int(tokens[: len(df)].max())
    return df, counts, templated


def max_token_chars(tokenizer: Any) -> int:
    """The most characters any single token of the vocabulary spells (>= 1): a bound on characters per token.

    Byte-level vocabularies spell one symbol per byte, so this over-counts characters (safe for `token_counts`).
    """
    return max(1, max((len(token) for token in tokenizer.get_vocab()), default=1))


def token_counts(prompts: list[str], tokenizer: Any, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Token counts of the prompts as the engines see them (no special tokens added), fast for huge prompts.

    A prompt of more than 2 * (limit + 1) * `max_token_chars` characters certainly has more than `limit` tokens
    (no token spells more than max_token_chars characters; the factor 2 covers normalizers that merge characters),
    so it is not tokenized (a 5 MB prompt takes tens of seconds): its count is the lower bound
    chars // (2 * max_token_chars).

    Returns:
        (n,) int64 token counts and (n,) bool, True where a count is that lower bound.
    """
    per_token = 2 * max_token_chars(tokenizer)
    chars = np.fromiter(map(len, prompts), dtype=np.int64, count=len(prompts))
    huge = chars > (limit + 1) * per_token
    counts = chars // per_token
    small = np.flatnonzero(~huge)
    if small.size:
        ids = tokenizer([prompts[i] for i in small], add_special_tokens=False, verbose=False)["input_ids"]
        counts[small] = [len(x) for x in ids]
    return counts, huge


def fit_context(
    df: pd.DataFrame, tokenizer: Any, context: int | None, max_new_tokens: int, bad_rows: str, source: str
) -> tuple[pd.DataFrame, np.ndarray | None, dict[str, int]]:
    """Check that every prompt leaves `max_new_tokens` of the policy's `context` for its response.

    bad_rows "error": UserError naming the ids, token counts and the limit; "drop": drop those prompts and count
    them (`dropped_too_long`). No check when the policy's config states no context (`context` None).

    Returns:
        The kept rows, their (n_kept,) token counts (None when not checked) and {dropped_too_long[,
        prompt_token_limit]}.
    """
    if context is None:
        return df, None, {"dropped_too_long": 0}
    limit = context - max_new_tokens
    if limit < 1:
        raise UserError(
            f"the policy's context (max_position_embeddings {context} tokens) leaves no room for a prompt next to "
            f"responses of up to {max_new_tokens} tokens (the larger of profile.max_new_tokens and "
            "runtime.sampling.max_new_tokens). Lower those below the context, or use a policy with a longer context."
        )
    counts, lower_bound = token_counts(df["prompt"].tolist(), tokenizer, limit)
    bad = counts > limit
    if bad.any() and bad_rows == "error":
        raise UserError(
            _too_long_message(df["prompt_id"].to_numpy()[bad], counts[bad], lower_bound[bad], source)
            + f" A prompt may have at most {limit} tokens: the policy's max_position_embeddings {context} "
            f"minus {max_new_tokens} response tokens (the larger of profile.max_new_tokens and "
            "runtime.sampling.max_new_tokens). Shorten or remove these prompts, set prepare.bad_rows: drop to drop "
            "them (counted as prepare/dropped_too_long), or lower the max_new_tokens settings."
        )
    return (
        df[~bad].reset_index(drop=True),
        counts[~bad],
        {"dropped_too_long": int(bad.sum()), "prompt_token_limit": limit},
    )


def _too_long_message(ids: np.ndarray, counts: np.ndarray, lower_bound: np.ndarray, source: str, show: int = 5) -> str:
    """'<source>: N prompts are too long for the policy's context: 'id' (T tokens), ...' (the first `show`)."""
    listed = [
        f"{pid!r} ({'at least ' if lb else ''}{int(n)} tokens)"
        for pid, n, lb in zip(ids[:show].tolist(), counts[:show], lower_bound[:show], strict=True)
    ]
    more = f" and {ids.size - show} more" if ids.size > show else ""
    noun = "prompt is" if ids.size == 1 else "prompts are"
    return f"{source}: {ids.size} {noun} too long for the policy's context: {', '.join(listed)}{more}."


def save_splits(df: pd.DataFrame, roles: np.ndarray, out_dir: Path) -> None:
    """`train.parquet` (every prompt), `profile.parquet` and `heldout.parquet` (their roles' rows)."""
    write_parquet(df, out_dir / "train.parquet")
    write_parquet(df[roles == "profile"].reset_index(drop=True), out_dir / "profile.parquet")
    write_parquet(df[roles == "heldout"].reset_index(drop=True), out_dir / "heldout.parquet")


def prepare_metrics(
    df: pd.DataFrame, n_raw: int, roles: np.ndarray, templated: bool, counts: dict[str, int]
) -> dict[str, Any]:
    """Prompt counts per role, prompt characters, whether templated, the dropped-row counts and, when the policy
    states its context, the prompt token limit and the longest kept prompt in tokens."""
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
    max_new_tokens = max(params.profile.max_new_tokens, params.runtime.sampling.max_new_tokens)
    df, counts, templated = build_prompts(raw, prep, source, paths.policy, max_new_tokens)
    roles = split_roles(len(df), prep.profile_prompts, prep.heldout_prompts, seed + 2)
    save_splits(df, roles, paths.out_dir)
    metrics = prepare_metrics(df, len(raw), roles, templated, counts)
    write_json(metrics, paths.metrics)
    tracker.log_params(
        {
            "prepare": prep.model_dump(),
            "common.seed": seed,
            "profile.max_new_tokens": params.profile.max_new_tokens,
            "runtime.sampling.max_new_tokens": params.runtime.sampling.max_new_tokens,
        }
    )
    tracker.log_metrics(metrics)
    return metrics
