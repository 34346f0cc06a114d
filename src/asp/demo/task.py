"""Built-in demo task: step-by-step running sums modulo 10 up to a named letter, with heavy-tailed problem sizes.

A problem names the letter to stop at and lists lettered terms, a bar after the stop letter's term; the
response adds the terms up to that letter one step at a time, modulo 10, and ends with the final answer::

    problem:   "Add mod 10 up to D: A3 B4 C2 D1 | E2 F4 G3"
    response:  "A3=3 B4=7 C2=9 D1=0 answer: 0"

Each step copies a term (capital letter + digit) from the prompt and writes the running sum after it. Every
step is five characters (five tokens of the demo policy's one-token-per-character tokenizer), so the response
length is ``5 * steps + 9`` tokens: it is driven by what the prompt *says* (the stop letter, and where the bar
stands), not by how long the prompt is. Every prompt lists more terms than it asks for: the listed count is drawn
independently of the steps, uniformly in ``[min_listed, max_listed]`` (8..16), and raised to ``steps + 1`` where
the steps reach it (the list always goes on past the bar). So the prompt's length alone ranks the answer lengths
poorly (Kendall τ 0.15 on the intended lengths, from the heavy tail only, where the list must grow with the
steps), while a text model that reads the stop letter ranks them well. The number of steps follows a discretized
lognormal (median ``median_steps``, log-standard-deviation ``tail``) clipped to ``[min_steps, max_steps]``,
``max_steps <= 25`` (one letter per term, one more listed).

Why this shape: a tiny transformer warm-started for a few minutes on a CPU learns it *partly*. Terms are small
(1..``max_term``, default 4) so the previous sum alone already narrows the next one, which lets gradient descent
find the addition; finding the term after letter D, E, ... in the prompt (an induction lookup) is learned more
slowly, so long problems stay hard. The bar is for the tiny policy: the lookup of the next letter's term that
it learns anyway also tells it whether that term stands past the bar, so it learns when to stop early, while
comparing the letter just written with the stop letter is learned slowly (docs/benchmarks.md, "Design notes
measured once", has the effect of the bar). The length
predictor reads the stop letter (one word at a fixed place). Sampled at temperature 1 the policy's lengths
follow the prompt's instruction closely while its reward is well inside (0, 1) -- what the profiler, the length
predictor and GRPO need.

Answer slips (``policy.demo.answer_slip_rate``, on in the demo): `warm_start_responses` can make the warm start's
demonstrator imperfect. A reference writes every step right and then, with that chance, states a wrong final answer
(`slipped_response`; the length is unchanged). The warm-started policy imitates the slips when it samples at
temperature 1, and GRPO's reward pays for copying the last sum instead: a habit one token long, which GRPO learns in
a few dozen updates on every problem whose steps the policy gets right. That makes GRPO's headroom a property of the
task rather than of how far a given machine's warm start got (docs/benchmarks.md, "The demo's GRPO gain across
seeds").

Shortcuts (the drift demo, ``configs/drift-demo.yaml``): `warm_start_responses` can replace the reference of a
share of the longer problems by `shortcut_response`, which writes only the first half of the steps and then the
answer. The warm-started policy copies the habit but cannot add the skipped terms in its head, so the partial
credit reward (`step_reward`) pays its shortcuts less than full responses and GRPO lengthens those responses:
the realized lengths drift away from what the length predictor learned.

Records are DeepScaleR-shaped (``problem``, ``answer``) plus ``id`` and ``steps``.

Run ``python -m asp.demo.task`` to print a few problems and the length distribution.
"""

from __future__ import annotations

import re
import string

import numpy as np

LETTERS = string.ascii_lowercase
MAX_STEPS = len(LETTERS) - 1  # one letter per term, and the list goes on past the stop letter
PROMPT_PREFIX = "Add mod 10 up to "  # + the stop letter + ": " + the listed terms
REST_MARK = "|"  # between the terms to add and the rest of the list
ANSWER_MARK = "answer:"
TOKENS_PER_STEP = 5
_ANSWER_RE = re.compile(r"answer\s*:\s*([^\s]*)", re.IGNORECASE)
_TERM_RE = re.compile(r"\b([A-Z])(\d)\b")
_STOP_RE = re.compile(r"\bup to ([A-Z])\s*:")
_STEP_RE = re.compile(r"\b([A-Z])(\d)=(\d)\b")


def _sample_steps(
    rng: np.random.Generator, n: int, *, min_steps: int, max_steps: int, median: float, tail: float
) -> np.ndarray:
    """Draw `n` step counts from a lognormal with the given median and log-sd, rounded and clipped."""
    raw = np.exp(np.log(median) + tail * rng.standard_normal(n))
    return np.clip(np.rint(raw), min_steps, max_steps).astype(np.int64)


def _validate(
    n: int,
    min_steps: int,
    max_steps: int,
    median_steps: float,
    tail: float,
    max_term: int,
    min_listed: int,
    max_listed: int,
) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= min_steps <= max_steps <= MAX_STEPS:
        raise ValueError(
            f"need 1 <= min_steps <= max_steps <= {MAX_STEPS}, got min_steps={min_steps}, max_steps={max_steps}"
        )
    if not 2 <= min_listed <= max_listed <= len(LETTERS):
        raise ValueError(
            f"need 2 <= min_listed <= max_listed <= {len(LETTERS)}, got min_listed={min_listed}, "
            f"max_listed={max_listed}"
        )
    if not 1 <= max_term <= 9:
        raise ValueError(f"max_term must be in [1, 9], got {max_term}")
    if median_steps <= 0 or tail < 0:
        raise ValueError(f"need median_steps > 0 and tail >= 0, got median_steps={median_steps}, tail={tail}")


def generate_problems(
    n: int,
    *,
    seed: int,
    min_steps: int = 1,
    max_steps: int = 24,
    median_steps: float = 4.0,
    tail: float = 0.75,
    max_term: int = 4,
    min_listed: int = 8,
    max_listed: int = 16,
    id_prefix: str = "arith",
) -> list[dict]:
    """Generate `n` running-sum problems, deterministically from `seed`.

    Args:
        n: number of records.
        seed: RNG seed; the same arguments always give the same records.
        min_steps: fewest terms to add per problem (>= 1).
        max_steps: most terms to add per problem (<= 25: one letter per term, and one more term is listed).
        median_steps: median of the lognormal step distribution before clipping.
        tail: log-standard-deviation of the step distribution; larger = heavier tail (0 = all `median_steps`).
        max_term: terms are drawn uniformly from 1..max_term (<= 9). The policy must be warm-started on the
            same value it is later prompted with.
        min_listed, max_listed: the number of listed terms is drawn uniformly from ``[min_listed, max_listed]``
            independently of the steps, then raised to ``steps + 1`` (2 <= min_listed <= max_listed <= 26).
        id_prefix: prefix of the record ids (``"arith-000123"``).

    Returns:
        `n` dicts with keys ``id`` (str), ``problem`` (str), ``answer`` (str, one digit) and ``steps`` (int, the
        number of terms to add; the problem lists more).
    """
    _validate(n, min_steps, max_steps, median_steps, tail, max_term, min_listed, max_listed)
    rng = np.random.default_rng(seed)
    steps = _sample_steps(rng, n, min_steps=min_steps, max_steps=max_steps, median=median_steps, tail=tail)
    listed_counts = np.maximum(rng.integers(min_listed, max_listed + 1, size=n), steps + 1)
    records = []
    for i, (k, m) in enumerate(zip(steps.tolist(), listed_counts.tolist(), strict=True)):
        terms = rng.integers(1, max_term + 1, size=m).tolist()
        written = [f"{LETTERS[j].upper()}{t}" for j, t in enumerate(terms)]
        listed = " ".join(written[:k]) + f" {REST_MARK} " + " ".join(written[k:])
        records.append(
            {
                "id": f"{id_prefix}-{i:06d}",
                "problem": f"{PROMPT_PREFIX}{LETTERS[k - 1].upper()}: {listed}",
                "answer": str(sum(terms[:k]) % 10),
                "steps": k,
            }
        )
    return records


def listed_terms(problem: str) -> list[int]:
    """Every term a problem text lists, in order (``"Add mod 10 up to A: A3 | B4"`` -> ``[3, 4]``)."""
    terms = [int(d) for _, d in _TERM_RE.findall(problem)]
    if not terms:
        raise ValueError(f"problem text lists no terms like 'A3': {problem!r}")
    return terms


def parse_terms(problem: str) -> list[int]:
    """The terms a problem asks to add, in order: those listed up to its stop letter.

    ``"Add mod 10 up to B: A3 B4 | C2"`` -> ``[3, 4]`` (the stop letter decides; the bar is for the policy). A
    text without ``up to <letter>:`` adds every listed term (``"Add mod 10: A3 B4"`` -> ``[3, 4]``). Raises
    ValueError when no term is listed or the stop letter is past the list.
    """
    terms = listed_terms(problem)
    stop = _STOP_RE.search(problem)
    if stop is None:
        return terms
    k = LETTERS.index(stop.group(1).lower()) + 1
    if k > len(terms):
        raise ValueError(f"problem text stops at {stop.group(1)} but lists only {len(terms)} terms: {problem!r}")
    return terms[:k]


def reference_response(record: dict) -> str:
    """The correct step-by-step response for a record (its ``problem`` text is the source of truth)."""
    total, parts = 0, []
    for j, t in enumerate(parse_terms(record["problem"])):
        total = (total + t) % 10
        parts.append(f"{LETTERS[j].upper()}{t}={total}")
    return " ".join(parts) + f" {ANSWER_MARK} {total}"


def intended_length(record: dict) -> int:
    """Length of the reference response in demo-policy tokens (= characters), EOS excluded: ``5 * steps + 9``.

    (Each step is ``"B4=7 "``; the tail is ``"answer: 0"``.)
    """
    return TOKENS_PER_STEP * len(parse_terms(record["problem"])) + len(ANSWER_MARK) + 2


def shortcut_steps(steps: int) -> int:
    """Steps a shortcut response writes before jumping to the answer: the first half, ``ceil(steps / 2)``."""
    return -(-steps // 2)


def shortcut_response(record: dict) -> str:
    """A response that skips the second half of the steps and states the true answer (``"A3=3 B4=7 answer: 0"``).

    The warm start shows it on some long problems (`warm_start_responses`); the answer is right in the reference,
    but a tiny model cannot add the skipped terms in its head, so its own shortcuts mostly state a wrong answer.
    With partial credit (`step_reward`) a shortcut earns at most ``0.5 * shortcut_steps(k) / k + 0.5``, usually
    far less, so GRPO learns to write every step: the policy's responses on long problems grow longer.
    """
    full = reference_response(record)
    keep = shortcut_steps(len(parse_terms(record["problem"])))
    return full[: TOKENS_PER_STEP * keep] + f"{ANSWER_MARK} {record['answer']}"


def slipped_response(record: dict, offset: int) -> str:
    """The reference's steps, then a final answer `offset` (1..9) away from the last sum written: a transcription
    slip of the demonstrator (0: `reference_response`).

    Example: ``"Add mod 10 up to B: A3 B4 | C2"`` with offset 2 -> ``"A3=3 B4=7 answer: 9"`` (the true answer is 7).
    """
    if not 0 <= offset <= 9:
        raise ValueError(f"need an offset in 0..9, got {offset}")
    terms = parse_terms(record["problem"])
    steps = reference_response(record)[: TOKENS_PER_STEP * len(terms)]
    return f"{steps}{ANSWER_MARK} {(sum(terms) + offset) % 10}"


def warm_start_responses(
    records: list[dict], *, skip_fraction: float, skip_min_steps: int, seed: int, answer_slip_rate: float
) -> list[str]:
    """The warm start's target response per record: `reference_response`, on some long problems a shortcut, and
    with `answer_slip_rate` a demonstrator that sometimes states a wrong final answer.

    Args:
        records: task records (``problem``, ``answer``).
        skip_fraction: probability that a problem with >= `skip_min_steps` terms gets `shortcut_response`
            (0: no record is shortcut, and no skip is drawn).
        skip_min_steps: fewest terms of a problem that may be shortcut (>= 2: a shortcut must skip a step).
        seed: seed of the draws (independent of the records' own generator): one uniform per record for the skip,
            then, with `answer_slip_rate`, one uniform and one offset per record.
        answer_slip_rate: probability that a (not shortcut) reference writes every step right and then states a
            wrong answer (`slipped_response`): an imperfect demonstrator, whose slips the warm-started policy imitates
            when it samples at temperature 1; GRPO's reward then pays for copying the last sum. 0: none (no slip
            is drawn).

    Returns:
        One response string per record, in order.
    """
    if not 0.0 <= skip_fraction <= 1.0 or skip_min_steps < 2 or not 0.0 <= answer_slip_rate < 1.0:
        raise ValueError(
            "need 0 <= skip_fraction <= 1, skip_min_steps >= 2 and 0 <= answer_slip_rate < 1, got "
            f"{skip_fraction}, {skip_min_steps}, {answer_slip_rate}"
        )
    if skip_fraction == 0.0 and answer_slip_rate == 0.0:
        return [reference_response(r) for r in records]
    rng = np.random.default_rng(seed)
    skips = rng.random(len(records)) if skip_fraction > 0.0 else np.ones(len(records))
    slips, offsets = np.zeros(len(records), bool), np.ones(len(records), np.int64)
    if answer_slip_rate > 0.0:  # drawn after the skips: the same records are shortcut whatever the rate
        slips = rng.random(len(records)) < answer_slip_rate
        offsets = rng.integers(1, 10, size=len(records))
    out = []
    for r, u, slip, offset in zip(records, skips.tolist(), slips.tolist(), offsets.tolist(), strict=True):
        if u < skip_fraction and len(parse_terms(r["problem"])) >= skip_min_steps:
            out.append(shortcut_response(r))
        else:
            out.append(slipped_response(r, offset) if slip else reference_response(r))
    return out


def _normalize(text: str) -> str:
    """Strip whitespace, a trailing period and leading zeros of integers (``" 07. "`` -> ``"7"``)."""
    text = text.strip().rstrip(".").strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return str(int(text))
    return text.lower()


def extract_answer(response: str) -> str | None:
    """The last stated answer (text after the last ``answer:``), or None when the response states none."""
    if not isinstance(response, str):
        return None
    found = _ANSWER_RE.findall(response)
    return found[-1] if found else None


def reward(response: str, answer: str) -> float:
    """1.0 when the last stated answer equals `answer` after normalization, else 0.0; never raises."""
    try:
        stated = extract_answer(response)
        if stated is None or not stated.strip():
            return 0.0
        return 1.0 if _normalize(stated) == _normalize(str(answer)) else 0.0
    except Exception:  # reward on arbitrary model output must never crash a rollout
        return 0.0


def step_reward(response: str, answer: str, prompt: str) -> float:
    """Partial credit: half for the final answer (`reward`), half for the fraction of steps written right.

    Step j of the response is right when it names letter j with the prompt's j-th term and the true running
    sum (``"B4=7"``); the fraction is over the problem's steps, so extra steps earn nothing. A fully correct
    response scores 1.0 (the same responses as `reward`, which stays the task's success criterion); every
    copied term and running sum counts, which gives GRPO a learning signal on problems the policy cannot
    solve end to end yet. Never raises (an unparsable prompt scores the final answer only).

    Example: prompt terms 3, 4; response ``"A3=3 B2=5 answer: 5"`` (answer 7): steps 1/2 right, final
    wrong -> 0.5 * 0.5 + 0.5 * 0 = 0.25.
    """
    final = reward(response, answer)
    try:
        terms = parse_terms(prompt)
        written = _STEP_RE.findall(response)
    except Exception:
        return 0.5 * final
    total, right = 0, 0
    for j, t in enumerate(terms):
        total = (total + t) % 10
        if j < len(written) and written[j] == (LETTERS[j].upper(), str(t), str(total)):
            right += 1
    return 0.5 * right / len(terms) + 0.5 * final


def simulated_profile(
    n: int,
    *,
    seed: int,
    responses_per_prompt: int = 8,
    cap: int = 256,
    p_early: float = 0.1,
    p_ramble: float = 0.05,
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Demo prompts with profiled-like mean lengths, for predictor tests and benchmarks (no policy needed).

    Each prompt's target imitates the mean over `responses_per_prompt` sampled responses of a partly trained
    policy: most samples have the intended length (`intended_length`) with Gaussian jitter (sd 3 tokens), a fraction
    `p_early` stops early (0.2-1x), a fraction `p_ramble` rambles towards `cap`.

    Returns:
        (prompt texts [n], mean response lengths float64 [n] in tokens, number of terms int [n]).
    """
    recs = generate_problems(n, seed=seed)
    rng = np.random.default_rng(seed + 1)
    base = np.array([intended_length(r) for r in recs], dtype=np.float64)[:, None]  # [n, 1]
    lengths = base + rng.normal(0.0, 3.0, size=(n, responses_per_prompt))
    early = rng.random((n, responses_per_prompt)) < p_early
    lengths = np.where(early, base * rng.uniform(0.2, 1.0, size=(n, responses_per_prompt)), lengths)
    ramble = rng.random((n, responses_per_prompt)) < p_ramble
    lengths = np.where(ramble, rng.uniform(base, cap, size=(n, responses_per_prompt)), lengths)
    lengths = np.clip(np.rint(lengths), 1, cap)
    return [r["problem"] for r in recs], lengths.mean(axis=1), np.array([r["steps"] for r in recs])


if __name__ == "__main__":
    recs = generate_problems(10_000, seed=0)
    lengths = np.array([intended_length(r) for r in recs])
    for r in recs[:3]:
        print(r, "->", reference_response(r))
    qs = np.percentile(lengths, [50, 90, 99, 100])
    print(f"intended length (tokens): mean={lengths.mean():.1f} p50/p90/p99/max={qs.tolist()}")
    from scipy.stats import kendalltau

    prompt_chars = [len(r["problem"]) for r in recs]
    print(f"Kendall tau of prompt length (characters) vs intended length: {kendalltau(prompt_chars, lengths)[0]:.3f}")
