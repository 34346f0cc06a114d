"""Rollouts you already have, read as profiled samples (`profile.source: file`, "bring your own lengths").

A lengths file holds one record per row (JSONL, a JSON list, Parquet or CSV; or a folder of such files, read in name
order): the prompt (text, chat messages or an id), one or more responses (lengths in tokens, token-id lists or text)
and optionally the policy step and finish reasons. `profile.lengths` (asp.config.LengthsFileParams) names the fields,
so the dumps of verl (``input`` / ``output`` / ``step``), OpenRLHF (``input`` / ``output``) and TRL's completions
table (``prompt`` / ``completion`` / ``step``) are read by naming theirs.

    records = read_rollouts("data/rollouts/run.jsonl")                  # [(where, record), ...]
    responses = parse_records(records, spec, max_new_tokens, count_tokens)
    samples, report = match_samples(responses, prompts, source)         # the profile stage's samples.parquet

Pure apart from reading the files: text is counted with the `count_tokens` callable the caller passes (the policy's
tokenizer). Every bad record is one `UserError` naming the file and the row (line for JSONL/CSV, 0-based row for
Parquet and JSON lists) and what to do: a non-positive or non-numeric length, an empty prompt, a prompt id given with
two different prompts, a length above the response cap; and no overlap with the prepared prompts. Tests:
tests/pipeline/test_profile_import.py.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from asp.config import LengthsFileParams
from asp.errors import UserError
from asp.io.files import read_user_json, read_user_jsonl

SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
FINISH_REASONS = ("stop", "length")
SAMPLE_COLUMNS = ["prompt_id", "role", "sample", "length", "finish_reason"]  # the profile stage's samples.parquet
ROLES = ("profile", "heldout")
Record = tuple[str, dict[str, Any]]  # (where: "<file> line 7", the record's fields)


@dataclass
class Responses:
    """Every kept response of a lengths file, one entry per response (parallel lists), in file order."""

    where: list[str] = field(default_factory=list)  # the record it came from
    prompt: list[str | None] = field(default_factory=list)  # prompt text (None without prompt_field)
    prompt_id: list[str | None] = field(default_factory=list)  # prompt id (None without id_field)
    length: list[int] = field(default_factory=list)
    finish_reason: list[str] = field(default_factory=list)
    records: int = 0  # records read (before the step filter)
    skipped_by_step: int = 0  # records dropped by min_step
    steps: list[int] = field(default_factory=list)  # the kept records' steps


# ------------------------------------------------------------------------------------------------------- reading


def rollout_files(path: str | Path) -> list[Path]:
    """The file at `path`, or every .jsonl/.json/.parquet/.csv file directly in folder `path` (name order)."""
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() not in SUFFIXES:
            raise UserError(f"{path}: unsupported lengths file type {path.suffix!r}; use {', '.join(SUFFIXES)}.")
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise UserError(
                f"{path}: no rollout files ({', '.join(SUFFIXES)}) in this folder. Put your rollouts there or point "
                "profile.lengths.path at the file (docs/lengths.md), or set profile.source: generate."
            )
        return files
    raise UserError(f"{path}: not found. Set profile.lengths.path to your rollouts file (or a folder of them).")


def read_rollouts(path: str | Path) -> list[Record]:
    """Every record of the file (or folder) at `path`, each with where it is ("<file> line N" / "row N")."""
    return [rec for f in rollout_files(path) for rec in _read_file(f)]


def _read_file(path: Path) -> list[Record]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return [(f"{path} line {n}", _object(rec, f"{path} line {n}")) for n, rec in read_user_jsonl(path)]
    if suffix == ".json":
        data = read_user_json(path)
        if not isinstance(data, list):
            raise UserError(f"{path}: expected a JSON list of records (one object per rollout).")
        return [(f"{path} record {i}", _object(rec, f"{path} record {i}")) for i, rec in enumerate(data)]
    try:
        frame = pd.read_parquet(path) if suffix == ".parquet" else pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - any decode failure: the file is unusable as it is
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path}: cannot be read as {suffix[1:].upper()} ({reason}). Export it again.") from None
    first = 2 if suffix == ".csv" else 0  # CSV: the header is line 1
    unit = "line" if suffix == ".csv" else "row"
    return [(f"{path} {unit} {first + i}", rec) for i, rec in enumerate(frame.to_dict("records"))]


def _object(rec: Any, where: str) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise UserError(f"{where}: a {type(rec).__name__}, not a JSON object (one object per rollout record).")
    return rec


# ------------------------------------------------------------------------------------------------------- parsing


def parse_records(
    records: Sequence[Record],
    spec: LengthsFileParams,
    max_new_tokens: int,
    count_tokens: Callable[[list[str]], list[int]] | None = None,
) -> Responses:
    """Check every record and flatten it into responses (see the module docstring for what is rejected).

    Args:
        records: `read_rollouts`'s (where, record) pairs.
        spec: the field names (profile.lengths).
        max_new_tokens: the response cap the rollouts were generated with (profile.max_new_tokens): a longer
            response is an error, one of exactly this length counts as truncated unless a finish reason is given.
        count_tokens: texts -> token counts (the policy's tokenizer); needed with `spec.response_field`.
    """
    if not records:
        raise UserError(f"{spec.path}: holds no records. Point profile.lengths.path at your rollouts.")
    out = Responses(records=len(records))
    first_prompt: dict[str, tuple[str, str]] = {}  # id -> (its first prompt text, where)
    texts: list[tuple[int, str, str]] = []  # (response index, text, where) to count with the tokenizer
    for where, rec in records:
        prompt = _prompt(rec, spec.prompt_field, where) if spec.prompt_field else None
        pid = _prompt_id(rec, spec.id_field, where) if spec.id_field else None
        if pid is not None and prompt is not None:
            seen = first_prompt.setdefault(pid, (prompt, where))
            if _norm(seen[0]) != _norm(prompt):
                raise UserError(
                    f"{where}: prompt id {pid!r} comes with a different prompt than at {seen[1]} "
                    f"({_short(prompt)} vs {_short(seen[0])}). One id must name one prompt: fix the ids, or set "
                    "profile.lengths.id_field: null to match records by their prompt text."
                )
        step = _step(rec, spec.step_field, where) if spec.step_field else None
        values = _responses(rec, spec, where)
        finish = _finish_reasons(rec, spec.finish_reason_field, len(values), where)
        if spec.min_step is not None and step is not None and step < spec.min_step:
            out.skipped_by_step += 1
            continue
        if step is not None:
            out.steps.append(step)
        for j, value in enumerate(values):
            if isinstance(value, str):
                texts.append((len(out.length), value, where))
                value = 0  # counted below
            out.where.append(where)
            out.prompt.append(prompt)
            out.prompt_id.append(pid)
            out.length.append(value)
            out.finish_reason.append(finish[j] if finish else "")
    if not out.length:
        raise UserError(
            f"{spec.path}: profile.lengths.min_step {spec.min_step} drops all {len(records)} records (their steps "
            "are below it). Lower min_step or set it to null."
        )
    _count_texts(out, texts, count_tokens)
    _check_lengths(out, max_new_tokens)
    return out


def _prompt(rec: dict[str, Any], name: str, where: str) -> str:
    value = _field(rec, name, where)
    if isinstance(value, list | tuple | np.ndarray):  # chat messages: the last user turn
        users = [m for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise UserError(f"{where}: '{name}' is a list without a user message ({{'role': 'user', ...}}).")
        if not isinstance(users[-1].get("content"), str):
            raise UserError(
                f"{where}: the last user message of '{name}' has no text in 'content' ({_short(users[-1])}). Give "
                "it its prompt text: {'role': 'user', 'content': '...'}."
            )
        value = users[-1]["content"]
    if not isinstance(value, str):
        raise UserError(f"{where}: '{name}' is {type(value).__name__} {_short(value)}, not prompt text.")
    if not value.strip():
        raise UserError(f"{where}: empty prompt in '{name}'. Remove the record or fill in its prompt.")
    return value


def _prompt_id(rec: dict[str, Any], name: str, where: str) -> str:
    value = _field(rec, name, where)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # CSV/Parquet read integer ids with gaps as floats
    if isinstance(value, bool) or not isinstance(value, str | int | np.integer) or not str(value).strip():
        raise UserError(f"{where}: '{name}' is {_short(value)}, not a prompt id (text or an integer).")
    return str(value)


def _step(rec: dict[str, Any], name: str, where: str) -> int:
    value = _field(rec, name, where)
    if isinstance(value, str) and value.strip().isdigit():  # TRL logs the step as text
        return int(value)
    number = _integer(value)
    if number is None or number < 0:
        raise UserError(f"{where}: '{name}' is {_short(value)}, not a policy step (an integer >= 0).")
    return number


def _responses(rec: dict[str, Any], spec: LengthsFileParams, where: str) -> list[Any]:
    """The record's responses: lengths (ints) or texts (counted later), one entry per response."""
    if spec.length_field:
        name = spec.length_field
        values = _as_list(_field(rec, name, where))
        lengths = [_integer(v) for v in values]
        for v, n in zip(values, lengths, strict=True):
            if n is None:
                raise UserError(
                    f"{where}: '{name}' holds {_short(v)}, not a response length (a whole number of tokens)."
                    + _list_hint(values)
                )
        return lengths
    if spec.token_ids_field:
        name = spec.token_ids_field
        value = _field(rec, name, where)
        if not isinstance(value, list | tuple | np.ndarray):
            raise UserError(f"{where}: '{name}' is {_short(value)}, not a list of token ids.")
        nested = len(value) > 0 and isinstance(value[0], list | tuple | np.ndarray)
        return [len(ids) for ids in value] if nested else [len(value)]
    assert spec.response_field
    values = _as_list(_field(rec, spec.response_field, where))
    for v in values:
        if not isinstance(v, str):
            raise UserError(f"{where}: '{spec.response_field}' holds {_short(v)}, not response text.")
    return values


def _finish_reasons(rec: dict[str, Any], name: str | None, n: int, where: str) -> list[str]:
    if not name:
        return []
    values = [str(v).strip().lower() for v in _as_list(_field(rec, name, where))]
    bad = [v for v in values if v not in FINISH_REASONS]
    if bad or len(values) != n:
        raise UserError(
            f"{where}: '{name}' holds {_short(values)}; give one of {'/'.join(FINISH_REASONS)} per response ({n}), "
            "or set profile.lengths.finish_reason_field: null."
        )
    return values


def _count_texts(out: Responses, texts: list[tuple[int, str, str]], count: Callable | None) -> None:
    if not texts:
        return
    if count is None:
        raise ValueError("response_field needs count_tokens (the policy's tokenizer)")
    for (i, _, _), n in zip(texts, count([t for _, t, _ in texts]), strict=True):
        out.length[i] = int(n)


def _check_lengths(out: Responses, cap: int) -> None:
    """Lengths in [1, cap]; an unstated finish reason is 'length' at the cap, else 'stop'."""
    for i, n in enumerate(out.length):
        if n < 1:
            what = "an empty response (0 tokens)" if n == 0 else f"response length {n}"
            raise UserError(
                f"{out.where[i]}: {what}; response lengths must be positive. Remove the record or fix its length."
            )
        if n > cap:
            raise UserError(
                f"{out.where[i]}: a response of {n} tokens is longer than profile.max_new_tokens ({cap}). Set "
                "profile.max_new_tokens to the response cap your rollouts were generated with."
            )
        if not out.finish_reason[i]:
            out.finish_reason[i] = "length" if n >= cap else "stop"


def _field(rec: dict[str, Any], name: str, where: str) -> Any:
    if name not in rec:
        present = ", ".join(map(str, list(rec)[:12])) or "none"
        raise UserError(
            f"{where}: no '{name}' field (fields present: {present}). Set profile.lengths' field names to the ones "
            "your file uses (docs/lengths.md)."
        )
    value = rec[name]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise UserError(f"{where}: '{name}' is empty. Fill it in or remove the record.")
    return value


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple | np.ndarray) else [value]


def _integer(value: Any) -> int | None:
    """A whole number (int, or a float without fraction, numpy included); None for anything else."""
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def _list_hint(values: list[Any]) -> str:
    return f" (the field holds {len(values)} values, one per response)" if len(values) > 1 else ""


def _short(value: Any, width: int = 60) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _norm(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------------------ matching


def match_samples(
    resp: Responses, prompts: pd.DataFrame, source: str, match: str = "exact"
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The responses of the prompts to profile as the profile stage's samples, and what was matched.

    Args:
        resp: `parse_records`'s responses.
        prompts: every prepared prompt: prompt_id, problem (raw text), prompt (chat-templated) and role ('profile',
            'heldout' or 'train'); the profile and held-out ones first, in the profile stage's order.
        source: the lengths path, for messages.
        match: 'exact' (text equal to a problem or a templated prompt, whitespace aside) or 'contains' (else the
            longest prepared problem the text contains, the first in `prompts` order on a tie: dumps of templated
            prompts with special tokens removed; `ContainsIndex`).

    Returns:
        samples (prompt_id, role, sample, length, finish_reason; prompts in `prompts` order, each prompt's responses
        in file order; every record goes to one prompt: see `one_prompt_per_record`) and a report: responses matched
        to a profiled / held-out prompt, to a prompt prepare keeps for training only, to none; prompts with and
        without lengths per role; the records' step range.
    """
    resp_rows, prompt_rows = _matches(resp, prompts, match, source)
    roles = prompts["role"].to_numpy()
    profiled = np.isin(roles[prompt_rows], ROLES)
    covered = {role: set(prompt_rows[roles[prompt_rows] == role].tolist()) for role in ROLES}
    missing = [role for role in ROLES if not covered[role]]
    if missing:
        raise UserError(_no_overlap(resp, prompts, source, missing))
    order = np.lexsort((resp_rows[profiled], prompt_rows[profiled]))  # prompt order, file order within a prompt
    rows, at = resp_rows[profiled][order], prompt_rows[profiled][order]
    frame = pd.DataFrame(
        {
            "prompt_id": prompts["prompt_id"].to_numpy()[at].astype(object),
            "role": roles[at].astype(object),
            "length": np.asarray(resp.length, dtype=np.int64)[rows],
            "finish_reason": np.asarray(resp.finish_reason, dtype=object)[rows],
        }
    )
    frame.insert(2, "sample", frame.groupby("prompt_id", sort=False).cumcount().astype(np.int64))
    to_profiled = np.unique(resp_rows[profiled])
    report = {
        "records": resp.records,
        "records_skipped_by_step": resp.skipped_by_step,
        "responses": len(resp.length),
        "responses_matched": int(to_profiled.size),
        "responses_train_only": int(np.setdiff1d(np.unique(resp_rows), to_profiled).size),
        "responses_unmatched": len(resp.length) - int(np.unique(resp_rows).size),
        **{f"{role}_prompts_with_lengths": len(covered[role]) for role in ROLES},
        **{f"{role}_prompts_without_lengths": int((roles == role).sum()) - len(covered[role]) for role in ROLES},
    }
    if resp.steps:
        report |= {"step_min": min(resp.steps), "step_max": max(resp.steps)}
    return frame[SAMPLE_COLUMNS], report


def _matches(resp: Responses, prompts: pd.DataFrame, match: str, source: str) -> tuple[np.ndarray, np.ndarray]:
    """(response row, prompt row) pairs: by id when the records carry ids, else by text (see `match_samples`), one
    prompt per record (`one_prompt_per_record`)."""
    if resp.prompt_id and resp.prompt_id[0] is not None:
        by_id = {pid: [i] for i, pid in enumerate(prompts["prompt_id"].astype(str))}
        found = [by_id.get(str(pid), []) for pid in resp.prompt_id]
    else:
        exact: dict[str, list[int]] = {}
        for column in ("problem", "prompt"):
            for i, text in enumerate(prompts[column]):
                rows = exact.setdefault(_norm(text), [])
                if i not in rows:
                    rows.append(i)
        index: ContainsIndex | None = None  # built when a text is no prepared text itself
        by_text: dict[str, list[int]] = {}
        for text in dict.fromkeys(t for t in resp.prompt if t is not None):
            key = _norm(text)
            if key not in exact and match == "contains":
                index = index or ContainsIndex([_norm(t) for t in prompts["problem"]])
                key = index.longest_in(key) or key
            by_text[text] = exact.get(key, [])
        found = [by_text[t] for t in resp.prompt]  # type: ignore[index]
        found = one_prompt_per_record(found, resp, prompts, source)
    resp_rows = [r for r, rows in enumerate(found) for _ in rows]
    prompt_rows = [i for rows in found for i in rows]
    return np.asarray(resp_rows, dtype=np.int64), np.asarray(prompt_rows, dtype=np.int64)


class ContainsIndex:
    """The longest of a set of texts (the prepared problems, normalized) that a given text contains, without trying
    every one of them: `match: contains` on a dump of 100k records against 40k prompts in seconds, not an hour.

    Each problem is filed under one piece of it (its anchor), chosen among a few candidates as the one the fewest
    other problems share: `q` characters starting right after one of its spaces (whitespace is normalized to single
    spaces); a problem without such a piece, under the longest piece after its first space, and one without a space
    under its first `q` characters. A text is looked up by its pieces of the anchors' widths: after each of its spaces
    (where a contained problem's space-anchored piece must lie) and, for the few problems without a space, at every
    position. Each problem whose anchor it holds is then checked in full at the anchor's place. The result is exactly
    `longest_contained_by_scan`'s: the longest contained problem, on a tie the one listed first. Cost per text: its
    words (times the distinct anchor widths, one unless problems are short) plus the problems checked.
    """

    def __init__(self, problems: Sequence[str], q: int = 16, candidates: int = 8) -> None:
        self.problems: list[str] = list(dict.fromkeys(p for p in problems if p))  # first-listed order: tie rank
        own = [_anchor_candidates(p, q, candidates) for p in self.problems]
        shared = Counter(piece for pieces in own for piece in {piece for _, piece, _ in pieces})
        # (after a space?, width) -> piece -> [(problem rank, the piece's offset in the problem)]
        self.anchors: dict[tuple[bool, int], dict[str, list[tuple[int, int]]]] = {}
        for rank, pieces in enumerate(own):
            offset, piece, after_space = min(pieces, key=lambda c: (shared[c[1]], c[0]))
            self.anchors.setdefault((after_space, len(piece)), {}).setdefault(piece, []).append((rank, offset))

    def longest_in(self, text: str) -> str | None:
        """The longest problem `text` contains (on a tie the one listed first), None if it contains none."""
        starts: list[int] = []
        best: int | None = None
        for (after_space, width), anchors in self.anchors.items():
            if after_space:
                if not starts:
                    starts = _word_starts(text) or [-1]
                hits = [text[i : i + width] for i in starts if i >= 0 and text[i : i + width] in anchors]
            else:
                hits = [text[i : i + width] for i in range(len(text) - width + 1) if text[i : i + width] in anchors]
            for piece in dict.fromkeys(hits):
                for rank, offset in anchors[piece]:
                    problem = self.problems[rank]
                    if best is not None and (len(problem), -rank) <= (len(self.problems[best]), -best):
                        continue
                    if _contains_at_anchor(text, problem, piece, offset):
                        best = rank
        return None if best is None else self.problems[best]


def _anchor_candidates(problem: str, q: int, n: int) -> list[tuple[int, str, bool]]:
    """(offset, piece, after a space) candidates for `problem`'s anchor (see `ContainsIndex`)."""
    starts = _word_starts(problem)
    if not starts:
        return [(0, problem[:q], False)]
    full = [i for i in starts if i + q <= len(problem)]
    if not full:
        return [(starts[0], problem[starts[0] : starts[0] + q], True)]
    step = max(1, len(full) // n)
    return [(i, problem[i : i + q], True) for i in full[::step]]


def _word_starts(text: str) -> list[int]:
    """The offsets right after each space of `text`."""
    return list(accumulate(len(word) + 1 for word in text.split(" ")[:-1]))


def _contains_at_anchor(text: str, problem: str, piece: str, offset: int) -> bool:
    """Whether `problem` occurs in `text` at some place where its anchor `piece` (at `offset` in it) occurs."""
    at = text.find(piece)
    while at >= 0:
        if at >= offset and text.startswith(problem, at - offset):
            return True
        at = text.find(piece, at + 1)
    return False


def longest_contained_by_scan(problems: Sequence[str], text: str) -> str | None:
    """The reference `ContainsIndex` is tested and benchmarked against: every problem tried, longest first (on a
    tie the one listed first); quadratic over a dump (records x problems)."""
    ordered = sorted(dict.fromkeys(p for p in problems if p), key=len, reverse=True)  # stable: ties in listed order
    return next((p for p in ordered if p in text), None)


def one_prompt_per_record(
    found: list[list[int]], resp: Responses, prompts: pd.DataFrame, source: str
) -> list[list[int]]:
    """Where a prompt text is the text of several prepared prompts, give each record one of them, never all.

    The records (a record's responses share its `resp.where`) whose text matches k > 1 prepared
    prompts (a dataset with repeated texts under different ids) are dealt in turn to those prompts, in `prompts`
    order: the first record of that text to the first prompt, the second to the second, ..., the k+1-th to the first
    again. When those prompts lie in both the profiled and the held-out role, the text cannot tell whose lengths a
    record holds and any split would put responses to one text on both sides of the tau gate: refused.

    Args:
        found: per response, the prompt rows its text matches.

    Raises:
        UserError: a repeated text in both the profile and heldout roles, naming it and profile.lengths.id_field.
    """
    roles = prompts["role"].to_numpy()
    dealt: dict[tuple[int, ...], dict[str, int]] = {}  # prompt rows of a text -> record -> the prompt row it got
    out: list[list[int]] = []
    for response, rows in enumerate(found):
        if len(rows) <= 1:
            out.append(rows)
            continue
        if {"profile", "heldout"} <= set(roles[rows].tolist()):
            raise UserError(_shared_text(resp.prompt[response] or "", prompts, rows, source))
        records = dealt.setdefault(tuple(rows), {})
        record = resp.where[response]
        if record not in records:
            records[record] = rows[len(records) % len(rows)]
        out.append([records[record]])
    return out


def _shared_text(text: str, prompts: pd.DataFrame, rows: list[int], source: str) -> str:
    ids = ", ".join(str(i) for i in prompts["prompt_id"].to_numpy()[rows[:4]]) + (", ..." if len(rows) > 4 else "")
    return (
        f"{source}: the prompt text {_short(text)} is the text of {len(rows)} prepared prompts (ids {ids}), some "
        "profiled and some held out, so a record matched by its text cannot say which prompt's lengths it holds, "
        "and giving them to all of them would put the same responses in the predictor's training and held-out "
        "data. Match by id instead: give the records their prompt ids and set profile.lengths.id_field to that "
        "field (prepare.id_field names the dataset's id column) (docs/lengths.md, 'Repeated prompt texts')."
    )


def _no_overlap(resp: Responses, prompts: pd.DataFrame, source: str, missing: list[str]) -> str:
    by = "id (profile.lengths.id_field)" if resp.prompt_id and resp.prompt_id[0] is not None else "prompt text"
    sample = next((p for p in (resp.prompt_id if by.startswith("id") else resp.prompt) if p is not None), "")
    sizes = " or ".join(f"{int((prompts['role'] == r).sum())} {r}" for r in missing)
    return (
        f"{source}: none of its {resp.records} records matches one of the {sizes} prompts of the prepare stage by "
        f"{by} (e.g. {_short(sample)}). The lengths must be of the prompts prepare splits: set prepare.dataset to "
        "the prompts your rollouts answered (prepare.id_field to their id field when you match by id; "
        "profile.lengths.match: contains when the file holds templated prompts) and prepare.profile_prompts / "
        "heldout_prompts to at most how many of them have lengths."
    )
