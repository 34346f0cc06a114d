"""`profile` and `predict` past one process: their minibatches (predictor batches) fanned out over Ray actors.

The actors and their placement are launch's: `actor_pool` starts Ray (or joins ``runtime.ray.address``) through
`asp.runtime.run.ray_session`, creates the placement groups of `asp.runtime.placement` for a layout of
Generation Units (`pool_config`: ``profile.actors: N`` is one unit of N actors, ``runtime`` is launch's
``generation_units x actors_per_unit``; ``runtime.ray.actor_num_cpus`` / ``actor_num_gpus`` per actor, no Training
Unit), starts one actor per bundle and waits until each loaded its model. Profiling actors ARE launch's
`asp.runtime.generation.GenerationActor` (one engine built from a picklable `EngineSpec`, one timed
``engine.generate`` per minibatch, seed = the minibatch's `WorkItem.seed`); predictor actors are `PredictorActor`.

`fan_out` is the dispatcher: one task per idle actor, results yielded as they complete (any order). A task whose
actor returned a `Failure` or raised is sent again (at most ``runtime.control.max_attempts`` sends); one whose actor
died (a lost node, an out-of-memory kill) goes to the surviving actors at once, and the dead actor rejoins when Ray
restarted it (``runtime.ray.actor_max_restarts``). With no actor left, or nothing finished within
``runtime.control.stall_timeout_s``, it stops with a `UserError`; what the caller saved (profile chunks) is kept.

A minibatch's seed depends only on its index (``common.seed + m``), never on which actor runs it, so the samples are
those of one in-process engine with the same settings (bit for bit on CPU with the same threads; on GPUs as
reproducible as the engine is). Predictor batches are formed once, globally (longest prompts first, as
`asp.predictor.train.predict_encoded` does), so every batch is padded exactly as unsharded.

    with profile_runner(RuntimeConfig.from_params(params), 2, spec, sampling) as runner:
        for m, result, actor in runner.run([(0, prompts0), (1, prompts1)], seed=0): ...

Tests: tests/pipeline/test_profile_ray.py (2 actors = 1 actor, a killed run resumes, sharded predict = unsharded).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from asp.control.messages import Failure, MinibatchOutput, WorkItem
from asp.errors import UserError
from asp.rollout.base import MinibatchResult, PromptResult, Sample, SamplingParams, minibatch_timing
from asp.runtime.config import RuntimeConfig
from asp.runtime.generation import GenerationActor
from asp.runtime.placement import create_placement
from asp.runtime.trainer import work_in

log = logging.getLogger(__name__)


def pool_config(runtime: RuntimeConfig, actors: int | str) -> RuntimeConfig:
    """The runtime config whose Generation Units are the pool's layout: `actors` = N is one unit of N actors,
    ``"runtime"`` keeps launch's ``ray.generation_units x ray.actors_per_unit``."""
    if actors == "runtime":
        return runtime
    ray = runtime.ray.model_copy(update={"generation_units": 1, "actors_per_unit": int(actors)})
    return runtime.model_copy(update={"ray": ray})


def pool_size(runtime: RuntimeConfig, actors: int | str) -> int:
    """How many actors `actors` means (1 = the in-process default)."""
    return pool_config(runtime, actors).total_actors


def dispatch_makespan(durations: Sequence[float], engines: int) -> tuple[float, list[float]]:
    """Wall time of `durations` (seconds per minibatch, in dispatch order) on `engines` engines that each take the
    next minibatch as soon as they are idle (what `fan_out` does), and each engine's busy seconds.

    Pure; e.g. ``dispatch_makespan([3, 1, 1, 1], 2) == (3.0, [3.0, 3.0])``.
    """
    if engines < 1:
        raise ValueError(f"engines must be >= 1, got {engines}")
    free = [(0.0, e) for e in range(engines)]  # (time the engine is next idle, engine)
    busy = [0.0] * engines
    for d in durations:
        t, e = heapq.heappop(free)
        busy[e] += float(d)
        heapq.heappush(free, (t + float(d), e))
    return max(t for t, _ in free), busy


def check_pool_resources(config: RuntimeConfig, knob: str) -> None:
    """`UserError` when the Ray cluster has fewer CPUs / GPUs in all than the pool's actors ask for."""
    import ray

    have = ray.cluster_resources()
    for kind, per_actor in (("CPU", config.ray.actor_num_cpus), ("GPU", config.ray.actor_num_gpus)):
        need = config.total_actors * per_actor
        if need > have.get(kind, 0.0) + 1e-9:
            raise UserError(
                f"{knob} asks for {config.total_actors} actors x runtime.ray.actor_num_{kind.lower()}s "
                f"{per_actor:g} = {need:g} {kind}s but the Ray cluster has {have.get(kind, 0.0):g}. Use fewer actors "
                f"({knob}), a "
                f"smaller runtime.ray.actor_num_{kind.lower()}s, or a bigger cluster (runtime.ray.address, "
                f"runtime.ray.num_{kind.lower()}s)."
            )


def _wait_ready(handles: dict[int, Any], timeout_s: float, what: str) -> None:
    """Wait until every actor answers `ready()`; `UserError` with the first load error or on timeout."""
    import ray

    refs = {handles[a].ready.remote(): a for a in handles}
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        raise UserError(
            f"{len(refs) - len(ready)} of {len(refs)} {what} actors did not start within {timeout_s:g} s "
            "(runtime.control.stall_timeout_s): the cluster lacks the resources or the model is slow to load."
        )
    for ref in ready:
        try:
            error = ray.get(ref)
        except ray.exceptions.RayError as exc:  # died while loading (out of memory, a lost node)
            error = f"the actor died ({type(exc).__name__}: {exc!s:.300})"
        if error:
            raise UserError(f"{what} actor {refs[ref]} could not load its model: {error}")


@contextlib.contextmanager
def actor_pool(
    config: RuntimeConfig, actor_cls: type, args: Callable[[int, int], tuple], *, what: str, knob: str
) -> Iterator[dict[int, Any]]:
    """Start (or join) Ray, place and start ``config.total_actors`` actors of `actor_cls` (``args(unit, actor)``
    are each one's constructor arguments), wait until all loaded; yield actor index -> handle. On exit every actor
    is killed, the placement groups removed and a Ray this started shut down."""
    import ray

    from asp.runtime.run import _sigterm_as_interrupt, ray_session

    with ray_session(config), _sigterm_as_interrupt():
        check_pool_resources(config, knob)
        placement = create_placement(config, 0)  # no Training Unit: only the units' groups
        handles: dict[int, Any] = {}
        try:
            remote = ray.remote(actor_cls)
            for g in range(config.ray.generation_units):
                for i in range(config.ray.actors_per_unit):
                    a = g * config.ray.actors_per_unit + i
                    options = dict(
                        num_cpus=config.ray.actor_num_cpus,
                        num_gpus=config.ray.actor_num_gpus,
                        max_restarts=config.ray.actor_max_restarts,
                        max_task_retries=0,
                    )
                    handles[a] = remote.options(**options, **placement.actor_options(g, i)).remote(*args(g, a))
            _wait_ready(handles, config.control.stall_timeout_s, what)
            log.info("%d %s actors on Ray (placement %s)", len(handles), what, placement.describe() or "none")
            yield handles
        finally:
            for handle in handles.values():
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
            placement.remove()


@dataclass
class Task:
    """One unit of work for `fan_out`: its index (minibatch or batch number), what to send, sends so far."""

    index: int
    payload: Any
    attempt: int = 0


def _revived(ref: Any) -> bool:
    """True when a restarted actor answered `ready()` with a loaded model."""
    import ray

    try:
        return ray.get(ref) is None
    except ray.exceptions.RayError:
        return False


def fan_out(
    actors: dict[int, Any],
    tasks: Iterable[Task],
    submit: Callable[[Any, Task], Any],
    *,
    error_of: Callable[[Any], str | None],
    max_attempts: int,
    stall_timeout_s: float,
    what: str,
) -> Iterator[tuple[Task, Any, int]]:
    """Run `tasks` on `actors` (see the module docstring); yield (task, result, actor index) as each completes.

    Args:
        actors: actor index -> Ray handle (each has a ``ready()`` method: None once its model is loaded).
        tasks: in the order they are to be started.
        submit: ``submit(handle, task)`` -> ObjectRef of the task's result.
        error_of: the error message a result carries (a `Failure`), or None when it is good.
        max_attempts: sends of one task before the run fails with its error.
        stall_timeout_s: longest wait for any result.
        what: the work's name in messages ("profile minibatch").

    Raises:
        UserError: a task failed `max_attempts` times, no actor is left, or nothing finished in `stall_timeout_s`.
    """
    import ray

    queue, idle = deque(tasks), deque(sorted(actors))
    inflight: dict[Any, tuple[int, Task]] = {}
    reviving: dict[Any, int] = {}

    def retry(task: Task, error: str) -> None:
        task.attempt += 1
        if task.attempt >= max_attempts:
            raise UserError(
                f"{what} {task.index} failed {task.attempt} times (runtime.control.max_attempts); last error: {error}"
            )
        log.warning("%s %d: %s; sending it again (attempt %d)", what, task.index, error, task.attempt + 1)
        queue.appendleft(task)

    while queue or inflight:
        while idle and queue:
            a, task = idle.popleft(), queue.popleft()
            inflight[submit(actors[a], task)] = (a, task)
        waiting = [*inflight, *reviving]
        if not waiting:
            raise UserError(f"every {what} actor died ({len(actors)} started); {len(queue)} tasks were not done.")
        ready, _ = ray.wait(waiting, num_returns=1, timeout=stall_timeout_s)
        if not ready:
            raise UserError(
                f"no {what} finished within {stall_timeout_s:g} s (runtime.control.stall_timeout_s); {len(reviving)} "
                "actors are waiting to be restarted (a lost node?). Rerun when the cluster is whole."
            )
        ref = ready[0]
        if ref in reviving:
            a = reviving.pop(ref)
            if _revived(ref):
                idle.append(a)
            else:
                log.warning("%s actor %d is gone for good", what, a)
            continue
        a, task = inflight.pop(ref)
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as exc:  # the actor (or its node) died mid-task
            reviving[actors[a].ready.remote()] = a
            retry(task, f"actor {a} died ({type(exc).__name__})")
            continue
        except ray.exceptions.RayTaskError as exc:
            idle.append(a)
            retry(task, f"{type(exc.cause).__name__}: {exc.cause}"[:500])
            continue
        idle.append(a)
        error = error_of(result)
        if error:
            retry(task, error)
            continue
        yield task, result, a


def minibatch_result(out: MinibatchOutput, max_new_tokens: int) -> MinibatchResult:
    """A generation actor's columnar output back as `PromptResult`s (lengths and finish reasons; no token ids)
    and the minibatch's timing (the actor's clock around its one ``engine.generate`` call)."""
    n = out.n
    results = [
        PromptResult(
            p,
            [
                Sample([], "", int(out.lengths[p * n + j]), "stop" if out.stopped[p * n + j] else "length", [])
                for j in range(n)
            ],
            int(out.prompt_tokens[p]),
        )
        for p in range(len(out.prompt_ids))
    ]
    timing = minibatch_timing(
        results, out.gen_end - out.gen_start, SamplingParams(n, max_new_tokens, 1.0, 1.0, 0)
    )  # n, max_new_tokens recorded
    return MinibatchResult(results, timing)


def _one_error(result: list[MinibatchOutput | Failure]) -> str | None:
    return result[0].reason if isinstance(result[0], Failure) else None


class ProfileRunner:
    """Profiling minibatches on a pool of launch's generation actors (see the module docstring)."""

    def __init__(self, actors: dict[int, Any], config: RuntimeConfig, sampling: SamplingParams) -> None:
        self.actors, self.config, self.sampling = actors, config, sampling

    def run(self, todo: list[tuple[int, list[str]]], seed: int) -> Iterator[tuple[int, MinibatchResult, int]]:
        """Generate minibatch m of `todo` ((m, prompt texts) pairs) with seed ``seed + m``; yield (m, result,
        actor) as minibatches complete."""
        tasks = [Task(m, texts) for m, texts in todo]

        def submit(handle: Any, task: Task) -> Any:
            item = WorkItem(task.index, task.index, 0, task.attempt, list(range(len(task.payload))), task.payload,
                            seed + task.index)  # fmt: skip
            return handle.generate.remote([item], None)

        for task, result, actor in fan_out(
            self.actors,
            tasks,
            submit,
            error_of=_one_error,
            max_attempts=self.config.control.max_attempts,
            stall_timeout_s=self.config.control.stall_timeout_s,
            what="profile minibatch",
        ):
            yield task.index, minibatch_result(result[0], self.sampling.max_new_tokens), actor


@contextlib.contextmanager
def profile_runner(
    runtime: RuntimeConfig, actors: int | str, engine_factory: Any, sampling: SamplingParams
) -> Iterator[ProfileRunner]:
    """A `ProfileRunner` over `actors` generation actors (``profile.actors``) that build their engines with
    `engine_factory` (an `EngineSpec`, checked here first); stopped on exit."""
    with generation_pool(runtime, actors, engine_factory, sampling, what="profile", knob="profile.actors") as pool:
        yield ProfileRunner(*pool, sampling)


@contextlib.contextmanager
def generation_pool(
    runtime: RuntimeConfig, actors: int | str, engine_factory: Any, sampling: SamplingParams, *, what: str, knob: str
) -> Iterator[tuple[dict[int, Any], RuntimeConfig]]:
    """(actor index -> handle, the pool's config) of `actors` launch `GenerationActor`s building their engines with
    `engine_factory` (an `EngineSpec`, checked here first) in this directory, as `actor_pool` starts and stops them
    (`what` / `knob`: the work's and the setting's names in its messages)."""
    getattr(engine_factory, "check", lambda: None)()
    config = pool_config(runtime, actors)
    cwd = os.getcwd()
    with actor_pool(
        config, GenerationActor, lambda g, a: (g, a, engine_factory, sampling, cwd), what=what, knob=knob
    ) as handles:
        yield handles, config


class PredictorActor:
    """One copy of the trained length predictor (wrapped with `ray.remote` by `predict_sharded`).

    Args:
        loader: picklable zero-argument callable returning (model, tokenizer, meta), e.g. a `functools.partial`
            of `asp.steps.loaders.load_trained_predictor`.
        cwd: the driver's working directory, to work in (relative paths); None: stay.
    """

    def __init__(self, loader: Callable[[], tuple[Any, Any, Any]], cwd: str | None = None) -> None:
        work_in(cwd)
        self.load_error: str | None = None
        try:
            self.model, self.tokenizer, _ = loader()
        except Exception as exc:  # surfaced by ready()
            self.load_error = f"{type(exc).__name__}: {exc}"

    def ready(self) -> str | None:
        """None when the predictor loaded, else its error message."""
        return self.load_error

    def encode(self, texts: list[str]) -> tuple[list[list[int]], list[bool]]:
        """Token ids and truncation flags of `texts` (`LengthPredictor.encode`: as the predictor was trained)."""
        enc = self.model.encode(self.tokenizer, texts)
        return enc.input_ids, enc.truncated

    def predict(self, batch: list[list[int]]) -> np.ndarray:
        """Model outputs (log1p scale) of one batch of token id lists, padded as `predict_encoded` pads it."""
        from asp.predictor.model import Encoded, pad_token_id
        from asp.predictor.train import predict_encoded

        enc = Encoded(batch, [False] * len(batch))
        return predict_encoded(
            self.model,
            enc,
            batch_size=len(batch),
            pad_id=pad_token_id(self.tokenizer),
            pad_side=self.tokenizer.padding_side,
        )


def _no_error(result: Any) -> None:
    return None


def predict_sharded(
    runtime: RuntimeConfig,
    actors: int | str,
    loader: Callable[[], tuple[Any, Any, Any]],
    texts: list[str],
    batch_size: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, int]:
    """Predicted log1p lengths [n] of `texts` and how many were truncated, on ``predict.actors`` predictor actors.

    Texts are tokenized in one contiguous part per actor; batches of `batch_size` are formed over all prompts,
    longest first (as unsharded), and each batch goes to whichever actor is idle; `progress(k)` is called with
    the k prompts of each finished batch.
    """
    config = pool_config(runtime, actors)

    def run(tasks: list[Task], submit: Callable[[Any, Task], Any], what: str) -> Iterator[tuple[Task, Any, int]]:
        return fan_out(
            handles,
            tasks,
            submit,
            error_of=_no_error,
            max_attempts=config.control.max_attempts,
            stall_timeout_s=config.control.stall_timeout_s,
            what=what,
        )

    cwd = os.getcwd()
    with actor_pool(
        config, PredictorActor, lambda g, a: (loader, cwd), what="predictor", knob="predict.actors"
    ) as handles:
        bounds = np.linspace(0, len(texts), len(handles) + 1).round().astype(int)
        parts = [Task(i, texts[lo:hi]) for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))]
        encoded: dict[int, tuple[list[list[int]], list[bool]]] = {}
        for task, result, _ in run(parts, lambda h, t: h.encode.remote(t.payload), "predictor encode"):
            encoded[task.index] = result
        ids = [row for i in range(len(parts)) for row in encoded[i][0]]
        n_truncated = sum(sum(encoded[i][1]) for i in range(len(parts)))
        order = np.argsort([-len(s) for s in ids], kind="stable")
        batches = [Task(b, order[s : s + batch_size]) for b, s in enumerate(range(0, len(ids), batch_size))]
        out = np.empty(len(ids), dtype=np.float64)
        for task, result, _ in run(
            batches, lambda h, t: h.predict.remote([ids[i] for i in t.payload]), "predictor batch"
        ):
            out[task.payload] = result
            if progress is not None:
                progress(len(task.payload))
    return out, int(n_truncated)
