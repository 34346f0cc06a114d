"""`profile` stage: roll out the policy on the profiling and held-out prompts to measure response lengths.

Each prompt gets `profile.n_samples` responses capped at `profile.max_new_tokens`. One engine call is one
minibatch of `profile.minibatch_prompts` prompts (timed: wall time, batch size, max and total tokens — a
later cost model fits these). Work is saved in chunks under `outputs/.work/profile/<key>/` as it finishes,
so a killed run resumes where it stopped, in the same MLflow run (``mlflow_run.json`` there; `resume_run_id`); the
key changes when the prompts, policy or params change. Chunks an earlier attempt left are checked first (readable,
the samples and timings their minibatches must have): a damaged one is named and generated again, the others kept.
A run removes the work directories of other keys when it starts (they can never be resumed by it, and a changed
input would otherwise leave them behind forever) and its own after it succeeded.

Outputs: outputs/profile/ (what later stages depend on; replaced as a whole, and the same inputs give the same
bytes) holds samples.parquet (prompt_id, role, sample, length, finish_reason) and prompts.parquet (per-prompt mean,
median, max, std, truncated_frac). Wall-clock values live outside it, in files no stage depends on:
metrics/profile_timings.csv (one row per minibatch: minibatch, wall_s, num_prompts, n, max_new_tokens,
total_tokens, max_length, prompt_tokens, actor; what a generation-time model is fitted on; after the profile's
minibatches, the calls of ``profile.timing_caps``, whose responses were cut at max_new_tokens = the cap and dropped:
schedules build short minibatches the profile's random ones never time), metrics/profile.json and
plots/profile_lengths.png (a length histogram like the paper's Figure 8). A resumed run's timings table holds the
minibatches of earlier sessions as they were timed then.

`profile.actors` > 1 (or ``runtime``) fans the minibatches out over Ray engine actors (`asp.runtime.profile_actors`,
launch's generation actors and placement; docs/profile_actors.md): minibatch m is sampled with seed
``common.seed + m`` on whichever actor, so the outputs are those of one engine; a chunk is written when all its
minibatches are done; the run key ignores the actor count, so a run resumes with any number of actors.

Run: `asp stage profile` (what `dvc repro profile` calls).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from asp.config import Params, ProfileParams
from asp.errors import UserError
from asp.io import atomic_path, read_json, write_json, write_parquet
from asp.pipeline.profile_import import import_samples
from asp.plots import save_figure
from asp.progress import progress_bar
from asp.rollout.base import MinibatchResult, MinibatchTiming, SamplingParams, timed_generate
from asp.runtime import RuntimeConfig
from asp.runtime.profile_actors import ProfileRunner, pool_size, profile_runner
from asp.runtime.testhooks import kill_point
from asp.steps.engine import profile_engine, profile_engine_spec
from asp.steps.loaders import policy_model_path
from asp.steps.paths import ProfilePaths as Paths
from asp.tracking import Tracker

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)
KEY_RE = re.compile(r"[0-9a-f]{16}")  # what `run_key` names work directories
# the timings CSV, in this order; `actor` (last: readers select columns by name) is the engine actor that ran it
TIMING_COLUMNS = ["minibatch", *(f.name for f in fields(MinibatchTiming)), "actor"]
RUN_FILE = "mlflow_run.json"  # in the work directory: the MLflow run a resumed profile continues
CAP_CALLS = 2  # timed calls per profile.timing_caps cap, each on the prompts of another profile minibatch
PASS_CALLS = 32  # most first-segment calls whose cut responses feed profile.timing_continuations' calls


def load_profile_prompts(prompts_dir: Path) -> pd.DataFrame:
    """The profiling and held-out prompts, with a `role` column."""
    frames = []
    for role in ("profile", "heldout"):
        path = prompts_dir / f"{role}.parquet"
        if not path.is_file():
            raise UserError(f"{path}: missing. Run the prepare stage first (`dvc repro prepare`).")
        frames.append(pd.read_parquet(path, columns=["prompt_id", "prompt"]).assign(role=role))
    return pd.concat(frames, ignore_index=True)


def run_key(prompts: pd.DataFrame, prof: ProfileParams, policy_ref: dict[str, Any], seed: int) -> str:
    """Identity of a profiling run: chunks from another key are never mixed in."""
    h = hashlib.sha256()
    # any number of actors makes the same samples; the capped calls are timed after the chunks, never saved in them
    settings = prof.model_dump(mode="json", exclude={"actors", "timing_caps", "timing_continuations"})
    h.update(json.dumps([settings, policy_ref.get("sha256"), seed], sort_keys=True).encode())
    h.update("\0".join(prompts["prompt_id"] + "\1" + prompts["prompt"]).encode())
    return h.hexdigest()[:16]


def minibatch_rows(result_rows: list[Any], ids: list[str], roles: list[str]) -> list[dict[str, Any]]:
    """Flatten one engine result (list of PromptResult) into sample rows."""
    rows = []
    for pid, role, res in zip(ids, roles, result_rows, strict=True):
        for j, sample in enumerate(res.samples):
            rows.append(
                {
                    "prompt_id": pid,
                    "role": role,
                    "sample": j,
                    "length": int(sample.length),
                    "finish_reason": sample.finish_reason,
                }
            )
    return rows


def read_chunk(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read a saved chunk (samples + timings); a corrupt one is a clear error naming the file."""
    try:
        samples = pd.read_parquet(path)
        timings = pd.DataFrame(read_json(path.with_suffix(".timings.json")))
    except Exception as exc:  # noqa: BLE001 - any decode failure means the chunk is unusable
        raise UserError(
            f"{path}: corrupt profiling chunk ({type(exc).__name__}: {exc}). Delete it (and its .timings.json) "
            "and run the stage again; the other chunks are kept."
        ) from None
    return samples, timings


def chunk_layout(n_prompts: int, prof: ProfileParams, work: Path) -> list[tuple[Path, range]]:
    """Every chunk's path and the minibatch indices it holds, in order (the last chunk may hold fewer)."""
    n_mb = -(-n_prompts // prof.minibatch_prompts)
    per_chunk = prof.chunk_minibatches
    return [
        (work / f"chunk_{c:05d}.parquet", range(c * per_chunk, min((c + 1) * per_chunk, n_mb)))
        for c in range(-(-n_mb // per_chunk))
    ]


def chunk_problem(path: Path, prompts: pd.DataFrame, minibatches: range, prof: ProfileParams) -> str | None:
    """Why a saved chunk cannot be used (one phrase), or None: it must be readable, with one timing per minibatch
    and `n_samples` samples of each of its prompts."""
    mb = prof.minibatch_prompts
    ids = prompts["prompt_id"].iloc[minibatches.start * mb : minibatches.stop * mb]
    try:
        samples, timings = read_chunk(path)
    except UserError as exc:
        return str(exc).split(". Delete it")[0].removeprefix(f"{path}: ")
    if len(timings) != len(minibatches) or len(samples) != len(ids) * prof.n_samples:
        return (
            f"holds {len(samples)} samples and {len(timings)} minibatch timings, not {len(ids) * prof.n_samples} "
            f"and {len(minibatches)} (cut short?)"
        )
    if "prompt_id" not in samples.columns or set(samples["prompt_id"]) != set(ids):
        return "holds samples of other prompts than its minibatches"
    return None


def check_chunks(prompts: pd.DataFrame, prof: ProfileParams, work: Path) -> list[Path]:
    """Before generating: remove every saved chunk that `chunk_problem` rejects (with its timings), saying which and
    why, so that it is generated again and the intact ones are kept. Returns the removed chunk paths."""
    layout = chunk_layout(len(prompts), prof, work)
    saved = [(path, mbs) for path, mbs in layout if path.is_file()]
    damaged = [(path, mbs, why) for path, mbs in saved if (why := chunk_problem(path, prompts, mbs, prof))]
    for path, minibatches, why in damaged:
        path.unlink(missing_ok=True)
        path.with_suffix(".timings.json").unlink(missing_ok=True)
        print(
            f"[profile] {path}: damaged ({why}); its {len(minibatches)} minibatch(es) are generated again, the "
            f"{len(saved) - len(damaged)} intact chunk(s) of the earlier attempt are kept",
            file=sys.stderr,
            flush=True,
        )
    return [path for path, _, _ in damaged]


def sampling_params(prof: ProfileParams) -> SamplingParams:
    """The sampling settings of every profiling minibatch (its seed is set per minibatch)."""
    return SamplingParams(
        prof.n_samples, prof.max_new_tokens, prof.temperature, prof.top_p, seed=0
    )  # seed: each minibatch's


def generate_minibatches(
    engine: Any, todo: list[tuple[int, list[str]]], sampling: SamplingParams, seed: int
) -> Iterator[tuple[int, MinibatchResult, int]]:
    """(minibatch, result, actor) of each (m, prompt texts) in `todo`, sampled with seed ``seed + m``: one timed
    ``generate`` call each, in order, on an in-process engine (actor 0); on a `ProfileRunner` (Ray actors) in the
    order they complete."""
    if isinstance(engine, ProfileRunner):
        yield from engine.run(todo, seed)
        return
    for m, texts in todo:
        yield m, timed_generate(engine, texts, sampling.with_seed(seed + m)), 0


def profile_chunks(engine: Any, prompts: pd.DataFrame, prof: ProfileParams, seed: int, work: Path) -> list[Path]:
    """Generate every missing chunk (a chunk is written as soon as all its minibatches are done); return all chunk
    paths in order. `engine`: an in-process engine or a `ProfileRunner` (`generate_minibatches`)."""
    mb = prof.minibatch_prompts
    layout = chunk_layout(len(prompts), prof, work)
    n_mb = sum(len(minibatches) for _, minibatches in layout)
    finished = sum(len(minibatches) for path, minibatches in layout if path.is_file())
    bar = progress_bar(total=n_mb, desc="profile", unit="minibatch", initial=finished)
    missing = {c: minibatches for c, (path, minibatches) in enumerate(layout) if not path.is_file()}
    todo = [(m, prompts["prompt"].iloc[m * mb : (m + 1) * mb].tolist()) for mbs in missing.values() for m in mbs]
    done: dict[int, dict[int, tuple[list[dict[str, Any]], dict[str, Any]]]] = {c: {} for c in missing}
    for m, result, actor in generate_minibatches(engine, todo, sampling_params(prof), seed):
        part = prompts.iloc[m * mb : (m + 1) * mb]
        c = m // prof.chunk_minibatches
        rows = minibatch_rows(result.results, part["prompt_id"].tolist(), part["role"].tolist())
        done[c][m] = (rows, timing_row(m, result.timing, actor))
        bar.update(1)
        bar.set_postfix(tok_s=f"{result.timing.tokens_per_s:.0f}")
        if len(done[c]) == len(missing[c]):
            write_chunk(layout[c][0], [done[c].pop(m) for m in missing[c]])
            kill_point(f"profile:chunk@{c}")
    bar.close()
    return [path for path, _ in layout]


def write_chunk(path: Path, minibatches: list[tuple[list[dict[str, Any]], dict[str, Any]]]) -> None:
    """Save one chunk: its minibatches' sample rows (Parquet) and timings (JSON), in minibatch order."""
    write_json([timing for _, timing in minibatches], path.with_suffix(".timings.json"))
    write_parquet(pd.DataFrame([row for rows, _ in minibatches for row in rows]), path)  # last: marks it complete


def per_prompt_stats(samples: pd.DataFrame) -> pd.DataFrame:
    """Per-prompt mean, median, max, std of response length and truncated fraction."""
    g = samples.assign(truncated=samples["finish_reason"].eq("length")).groupby(["prompt_id", "role"], sort=False)
    return (
        g.agg(
            mean_length=("length", "mean"),
            median_length=("length", "median"),
            max_length=("length", "max"),
            std_length=("length", "std"),
            truncated_frac=("truncated", "mean"),
            samples=("length", "size"),
        )
        .reset_index()
        .fillna({"std_length": 0.0})
    )


def length_histogram(samples: pd.DataFrame, cap: int) -> Figure:
    """Figure: distribution of sampled response lengths (the paper's Figure 8), cap marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.hist(samples["length"], bins=60, color="#4477aa")
    ax.axvline(cap, color="#cc3311", ls="--", label=f"cap = {cap} tokens")
    ax.set(xlabel="response length (tokens)", ylabel="samples", title="Profiled response lengths")
    ax.legend()
    fig.tight_layout()
    return fig


def prune_work_dirs(work: Path) -> list[Path]:
    """Remove the work directories of other run keys next to `work` (only names `run_key` makes); return them."""
    stale = [p for p in work.parent.iterdir() if p.is_dir() and p.name != work.name and KEY_RE.fullmatch(p.name)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    if stale:
        log.info("removed %d profiling work directories of other inputs: %s", len(stale), [p.name for p in stale])
    return stale


def work_dir(paths: Paths, prompts: pd.DataFrame, prof: ProfileParams, seed: int) -> Path:
    """This run's work directory (keyed by prompts, policy and params; not created)."""
    policy_ref = read_json(paths.policy / "policy.json") if (paths.policy / "policy.json").is_file() else {}
    return paths.work_dir / run_key(prompts, prof, policy_ref, seed)


def load_inputs(paths: Paths, prof: ProfileParams, seed: int) -> tuple[pd.DataFrame, Path]:
    """The prompts to profile and this run's work directory (created; work directories of other keys are removed;
    damaged chunks of an earlier attempt are removed, `check_chunks`)."""
    prompts = load_profile_prompts(paths.prompts)
    if prompts.empty:
        raise UserError(f"{paths.prompts}: no profiling prompts. Raise prepare.profile_prompts.")
    work = work_dir(paths, prompts, prof, seed)
    work.mkdir(parents=True, exist_ok=True)
    prune_work_dirs(work)
    check_chunks(prompts, prof, work)
    return prompts, work


def resume_run_id(params: Params, paths: Paths) -> str | None:
    """The MLflow run of an earlier attempt of this profiling run that was killed (its work directory names it);
    None for a new run."""
    try:
        prompts = load_profile_prompts(paths.prompts)
        record = read_json(work_dir(paths, prompts, params.profile, params.common.seed) / RUN_FILE)
        return str(record["run_id"]) if isinstance(record, dict) and record.get("run_id") else None
    except (UserError, OSError, ValueError, KeyError, TypeError):
        return None  # `run` reports bad inputs


def cap_calls(prompts: pd.DataFrame, prof: ProfileParams, seed: int) -> list[tuple[int, list[str], SamplingParams]]:
    """The extra timed calls of ``profile.timing_caps`` (pure): `CAP_CALLS` per cap below ``max_new_tokens``, on the
    prompts of the first minibatches, numbered after the profile's minibatches and seeded ``seed`` + that number (no
    profile minibatch has that seed)."""
    mb = prof.minibatch_prompts
    first = -(-len(prompts) // mb)  # the profile's minibatch count
    sets = [prompts["prompt"].iloc[i * mb : (i + 1) * mb].tolist() for i in range(min(CAP_CALLS, first))]
    caps = [c for c in prof.timing_caps if c < prof.max_new_tokens]
    calls: list[tuple[int, list[str], SamplingParams]] = []
    for cap in caps:
        for texts in sets:
            m = first + len(calls)
            calls.append((m, texts, replace(sampling_params(prof), max_new_tokens=cap).with_seed(seed + m)))
    return calls


@dataclass(frozen=True)
class ContinuationPlan:
    """What `time_continuations` times (`continuation_plan`): ``budget`` tokens per response per call (the
    launch's ``runtime.partial.token_budget``), continuation calls of ``targets`` rows each, their rows cut by first
    segments of ``passes`` ((minibatch number, prompt texts, sampling capped at the budget), at most
    `PASS_CALLS`), and ``limit`` = ``max_new_tokens`` (a row continues for at most the budget, and at most what
    the cap leaves it)."""

    budget: int
    limit: int
    targets: tuple[int, ...]
    passes: tuple[tuple[int, tuple[str, ...], SamplingParams], ...]


def continuation_plan(params: Params, prompts: pd.DataFrame, first: int) -> ContinuationPlan | None:
    """The continuation calls of ``profile.timing_continuations`` (pure), or None when none are timed: partial
    rollouts off (``runtime.partial.enabled``), no calls asked for, or a budget at or above ``max_new_tokens`` (no
    response is ever cut).

    A launch with partial rollouts continues unfinished responses in calls of up to ``runtime.partial.max_rows`` rows
    (null: a minibatch's rows), each one prompt of one sample whose context (prompt + tokens so far) is prefilled
    again: a shape the profile's minibatches never time (many contexts of a hundred tokens, few tokens each). The
    plan's calls hold 1/k of the rows for k = `timing_continuations` .. 1, the largest last; `first` numbers the
    first-segment calls (seeded with ``common.seed`` + their number), on the profile's minibatches' prompts in turn.
    """
    prof, partial = params.profile, params.runtime.partial
    calls = prof.timing_continuations
    if not partial.enabled or calls < 1 or partial.token_budget >= prof.max_new_tokens or prompts.empty:
        return None
    rows = partial.max_rows or prof.minibatch_prompts * prof.n_samples
    targets = tuple(sorted({max(1, rows // k) for k in range(calls, 0, -1)}))
    mb, texts = prof.minibatch_prompts, prompts["prompt"].tolist()
    sets = -(-len(texts) // mb)
    sampling = replace(sampling_params(prof), max_new_tokens=partial.token_budget)
    passes = tuple(
        (
            first + i,
            tuple(texts[(i % sets) * mb : (i % sets + 1) * mb]),
            sampling.with_seed(params.common.seed + first + i),
        )
        for i in range(PASS_CALLS)
    )
    return ContinuationPlan(partial.token_budget, prof.max_new_tokens, targets, passes)


def timing_row(m: int, timing: MinibatchTiming, actor: int = 0) -> dict[str, Any]:
    """The timings row of call `m` (`TIMING_COLUMNS`) that `actor` timed."""
    return {"minibatch": m, **asdict(timing), "actor": actor}


def continuation_row(m: int, wall_s: float, contexts: list[int], new: list[int], budget: int) -> dict[str, Any]:
    """The timings row of a continuation call (pure): ``len(new)`` prompts of one sample, their contexts' tokens as
    the prompt tokens, ``max_new_tokens`` the budget: the shape `asp.sim.engine` prices a continuation item by."""
    return {
        "minibatch": m,
        "wall_s": wall_s,
        "num_prompts": len(new),
        "n": 1,
        "max_new_tokens": budget,
        "total_tokens": int(sum(new)),
        "max_length": int(max(new, default=0)),
        "prompt_tokens": int(sum(contexts)),
        "actor": 0,
    }


def time_continuations(engine: Any, plan: ContinuationPlan) -> tuple[pd.DataFrame, int]:
    """Time `plan` on an in-process engine: first segments capped at the budget (timed too: rows like the caps')
    until each target's rows were cut, then one ``continue_responses`` call of those rows (each continues for
    ``min(budget, limit - tokens so far)``). Responses are dropped. Returns the rows of `TIMING_COLUMNS` and how
    many continuation calls they hold; a target the passes could not fill is continued with the rows there are
    (none: not timed)."""
    rows: list[dict[str, Any]] = []
    pool: list[tuple[str, list[int], int]] = []  # (prompt text, tokens so far, prompt tokens) of each cut response
    targets, calls = list(plan.targets), 0
    m = plan.passes[-1][0] + 1 if plan.passes else 0
    passes = iter(plan.passes)
    with progress_bar(total=len(targets), desc="timing continuations", unit="call") as bar:
        while targets:
            step = next(passes, None)
            if step is not None:
                pm, texts, sampling = step
                result = timed_generate(engine, list(texts), sampling)
                rows.append(timing_row(pm, result.timing))
                pool += [
                    (texts[r.prompt_index], list(smp.token_ids), r.prompt_tokens)
                    for r in result.results
                    for smp in r.samples
                    if smp.finish_reason == "length" and smp.length < plan.limit
                ]
                if len(pool) < targets[0]:
                    continue
            take = pool[: targets.pop(0)]
            pool = pool[len(take) :]
            if not take:
                break
            limits = [min(plan.budget, plan.limit - len(ids)) for _, ids, _ in take]
            sampling = replace(plan.passes[0][2], n=1).with_seed(plan.passes[0][2].seed + m)
            t0 = time.perf_counter()
            out = engine.continue_responses([t for t, _, _ in take], [ids for _, ids, _ in take], sampling, limits)
            wall = time.perf_counter() - t0
            rows.append(
                continuation_row(m, wall, [pt + len(ids) for _, ids, pt in take], [o.length for o in out], plan.budget)
            )
            m, calls = m + 1, calls + 1
            bar.update(1)
    return pd.DataFrame(rows, columns=TIMING_COLUMNS), calls


def time_caps(engine: Any, prompts: pd.DataFrame, prof: ProfileParams, seed: int) -> pd.DataFrame:
    """Time the calls of `cap_calls` on an in-process engine: their timing rows (`TIMING_COLUMNS`, max_new_tokens =
    the cap); the responses are dropped (cut short, they are no profile)."""
    rows = [
        timing_row(m, timed_generate(engine, texts, sampling).timing)
        for m, texts, sampling in progress_bar(cap_calls(prompts, prof, seed), desc="timing caps", unit="call")
    ]
    return pd.DataFrame(rows, columns=TIMING_COLUMNS)


def run_chunks(engine: Any, prompts: pd.DataFrame, params: Params, work: Path) -> tuple[list[Path], pd.DataFrame, int]:
    """`profile_chunks`, `time_caps` then `time_continuations` on one engine, closing it afterwards whatever
    happens: the chunks, the extra timing rows, and how many of them are continuation calls."""
    prof, seed = params.profile, params.common.seed
    try:
        chunks = profile_chunks(engine, prompts, prof, seed, work)
        capped = time_caps(engine, prompts, prof, seed)
        plan = continuation_plan(params, prompts, -(-len(prompts) // prof.minibatch_prompts) + len(capped))
        if plan is None:
            return chunks, capped, 0
        continued, calls = time_continuations(engine, plan)
        return chunks, pd.concat([capped, continued], ignore_index=True), calls
    finally:
        getattr(engine, "close", lambda: None)()


def generate(params: Params, paths: Paths, prompts: pd.DataFrame, work: Path) -> tuple[list[Path], pd.DataFrame, int]:
    """Every chunk, generated by one engine in this process (``profile.actors: 1``) or fanned out over Ray engine
    actors (`asp.runtime.profile_actors`; ``runtime.ray.address``, ``runtime.ray.actor_num_cpus`` / ``actor_num_gpus``
    and ``runtime.ray.placement`` as for launch's Generation Units), and the timings of ``profile.timing_caps`` and
    ``profile.timing_continuations`` with how many continuation calls they hold (one engine in this process only: an
    actor's cap is fixed when it starts)."""
    prof, seed = params.profile, params.common.seed
    runtime = RuntimeConfig.from_params(params)
    if pool_size(runtime, prof.actors) == 1 and prof.actors != "runtime":
        return run_chunks(profile_engine(prof, policy_model_path(paths.policy), seed), prompts, params, work)
    spec = profile_engine_spec(prof, policy_model_path(paths.policy), seed)
    with profile_runner(runtime, prof.actors, spec, sampling_params(prof)) as runner:
        chunks = profile_chunks(runner, prompts, prof, seed, work)
    if cap_calls(prompts, prof, seed) or continuation_plan(params, prompts, 0) is not None:
        print(
            "profile: profile.timing_caps and timing_continuations not timed (Ray engine actors sample with the cap "
            "they started with); the simulator's time model is fitted on the profile's minibatches only",
            file=sys.stderr,
            flush=True,
        )
    return chunks, pd.DataFrame(columns=TIMING_COLUMNS), 0


def collect_chunks(chunk_paths: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All samples and minibatch timings of the saved chunks, in chunk order."""
    parts = [read_chunk(c) for c in chunk_paths]
    samples = pd.concat([s for s, _ in parts], ignore_index=True)
    timings = pd.concat([t if "actor" in t.columns else t.assign(actor=0) for _, t in parts], ignore_index=True)
    if samples.empty:
        raise UserError("profiling produced zero samples; check profile.n_samples and the prompt files.")
    return samples, timings


def save_outputs(samples: pd.DataFrame, stats: pd.DataFrame, out_dir: Path) -> None:
    """samples.parquet and prompts.parquet (per-prompt stats): `out_dir` is replaced as a whole (nothing stale)."""
    with atomic_path(out_dir) as out:
        out.mkdir(parents=True)
        write_parquet(samples, out / "samples.parquet")
        write_parquet(stats, out / "prompts.parquet")


def save_timings(timings: pd.DataFrame, path: Path) -> None:
    """The per-minibatch timings as CSV (`TIMING_COLUMNS`; floats written to round-trip), atomically."""
    with atomic_path(path) as tmp:
        timings[TIMING_COLUMNS].to_csv(tmp, index=False)


def profile_metrics(
    samples: pd.DataFrame, stats: pd.DataFrame, timings: pd.DataFrame, wall_s: float
) -> dict[str, Any]:
    """Length statistics, truncation rate and throughput; `wall_s`: seconds this session took (not earlier ones)."""
    gen_s = float(timings["wall_s"].sum())
    return {
        "profile/prompts": int(len(stats)),
        "profile/samples": int(len(samples)),
        "profile/mean_length": float(samples["length"].mean()),
        "profile/median_length": float(samples["length"].median()),
        "profile/p99_length": float(np.percentile(samples["length"], 99)),
        "profile/truncation_rate": float(samples["finish_reason"].eq("length").mean()),
        "profile/tokens_per_s": float(timings["total_tokens"].sum() / max(gen_s, 1e-9)),
        "profile/generation_s": gen_s,
        "profile/wall_s_this_run": wall_s,
        "profile/minibatches": int(len(timings)),
    }


def run(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """Profile the policy; write samples and per-prompt stats, then the timings, metrics and histogram."""
    if params.profile.source == "file":  # bring your own lengths: read, not generated
        return run_from_file(params, paths, tracker)
    prof, seed = params.profile, params.common.seed
    prompts, work = load_inputs(paths, prof, seed)
    if tracker.run_id:
        write_json({"run_id": tracker.run_id}, work / RUN_FILE)
    tracker.log_params({"profile": prof.model_dump(), "common.seed": seed})
    kill_point("profile:start")
    t0 = time.perf_counter()
    chunks, capped, continued = generate(params, paths, prompts, work)
    kill_point("profile:chunks")
    samples, timings = collect_chunks(chunks)
    stats = per_prompt_stats(samples)
    save_outputs(samples, stats, paths.out_dir)
    kill_point("profile:outputs")
    save_timings(pd.concat([timings, capped], ignore_index=True) if len(capped) else timings, paths.timings)
    metrics = profile_metrics(samples, stats, timings, time.perf_counter() - t0) | {
        "profile/cap_calls": len(capped) - continued,
        "profile/continuation_calls": continued,
    }
    write_json(metrics, paths.metrics)
    save_figure(length_histogram(samples, prof.max_new_tokens), paths.plot, tracker)
    tracker.log_metrics(metrics)
    shutil.rmtree(work, ignore_errors=True)
    return metrics


def run_from_file(params: Params, paths: Paths, tracker: Tracker) -> dict[str, Any]:
    """`profile.source: file`: the lengths of rollouts the user has (`asp.pipeline.profile_import`), written as
    `run` writes generated ones. Nothing was timed: the timings table holds its header only (simulate says so)."""
    prof = params.profile
    tracker.log_params({"profile": prof.model_dump(), "common.seed": params.common.seed})
    t0 = time.perf_counter()
    samples, report = import_samples(params, paths.prompts, paths.policy)
    stats = per_prompt_stats(samples)
    save_outputs(samples, stats, paths.out_dir)
    save_timings(pd.DataFrame(columns=TIMING_COLUMNS), paths.timings)
    measured = profile_metrics(samples, stats, pd.DataFrame({"wall_s": [], "total_tokens": []}), 0.0)
    untimed = ("profile/tokens_per_s", "profile/generation_s", "profile/minibatches")
    metrics = {k: v for k, v in measured.items() if k not in untimed}
    metrics |= {"profile/wall_s_this_run": time.perf_counter() - t0, **report}
    write_json(metrics, paths.metrics)
    save_figure(length_histogram(samples, prof.max_new_tokens), paths.plot, tracker)
    tracker.log_metrics(metrics)
    return metrics
