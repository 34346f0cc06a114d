"""Generation Units and generation actors (paper appendix B.5), as plain classes wrapped by `ray.remote` later.

`GenerationActor` owns one engine (built in the actor from a picklable factory, e.g. `EngineSpec`) and
decodes one minibatch per call. Weight refresh is deferred: a `WeightUpdate` newer than the actor's
weights is passed along with the actor's next minibatch and loaded *before* decoding it, i.e. after the
previous minibatch finished; no actor is interrupted mid-decode.

Partial rollouts (``runtime.partial``): a `WorkItem` with a ``budget`` is decoded with at most that many tokens per
response (responses that did not stop come back unfinished, `MinibatchOutput.finished`); a continuation item
(``WorkItem.rows``) continues its rows from prompt + tokens so far (`ContinuingEngine.continue_responses`) and comes
back as a `SegmentOutput`. Both are decoded with whatever weights the actor loaded before the call.

`GenerationUnit` is the GU's control process (an async Ray actor): it holds the GU's input queue, hands
minibatches to idle actors one at a time unless generation is paused (backpressure: queued minibatches
wait, decoding ones finish), and returns completed outputs, failures and dead actors to the Control Unit
in batches through a long-poll `collect`. Ray does not run an async actor's calls in the order they were
sent, so `submit` and `set_paused` carry the Control Unit's sequence numbers: a pause that overtakes the resume
sent after it is ignored, and minibatches join the queue in the order they were sent. An actor that dies
mid-minibatch yields a `Failure` (the task goes back to the Database); Ray restarts it (``max_restarts``) and it
is fed again with fresh weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from asp.control.messages import Failure, GUReport, MinibatchOutput, SegmentOutput, WeightUpdate, WorkItem
from asp.rollout.base import ContinuingEngine, SamplingParams
from asp.runtime.trainer import work_in

log = logging.getLogger(__name__)


def resolve_weights(payload: Any) -> Mapping[str, Any]:
    """Turn a `WeightUpdate.payload` into a tensor mapping: an ObjectRef is fetched, a path is read as
    safetensors, safetensors bytes are deserialized, a mapping is used as is. The conversion hook runs in the
    Training Unit before publishing (`asp.trainers.weights.convert`), so what arrives here is what the
    engine loads.

    Raises:
        FileNotFoundError / OSError / SafetensorError / TypeError: missing or corrupt snapshot (the actor then
            keeps its weights and is offered the snapshot again with its next minibatch).
    """
    if isinstance(payload, Mapping):
        return payload
    if isinstance(payload, str):
        from safetensors.torch import load_file

        return load_file(payload)
    if isinstance(payload, bytes | bytearray | memoryview):
        from safetensors.torch import load

        return load(bytes(payload))
    import ray

    if isinstance(payload, ray.ObjectRef):
        return resolve_weights(ray.get(payload))
    raise TypeError(f"cannot load weights from a {type(payload).__name__}")


def pack_output(
    item: WorkItem, results: list[Any], n: int, *, gu: int, actor: int, version: int, start: float, end: float
) -> MinibatchOutput:
    """Flatten an engine's `PromptResult`s into a columnar `MinibatchOutput`.

    Raises:
        ValueError: when the engine returned the wrong number of prompts or samples.
    """
    if len(item.prompt_ids) != len(item.prompts):
        raise ValueError(f"task {item.task_id} has {len(item.prompt_ids)} prompt ids for {len(item.prompts)} prompts")
    if len(results) != len(item.prompts) or any(len(r.samples) != n for r in results):
        raise ValueError(
            f"engine returned {len(results)} prompts / sample counts {[len(r.samples) for r in results][:4]} "
            f"for {len(item.prompts)} prompts with n={n}"
        )
    samples = [s for r in results for s in r.samples]
    lengths = np.fromiter((s.length for s in samples), np.int32, len(samples))
    with_lp = all(len(s.logprobs) == s.length for s in samples)
    return MinibatchOutput(
        task_id=item.task_id,
        minibatch_id=item.minibatch_id,
        attempt=item.attempt,
        gu=gu,
        actor=actor,
        policy_version=version,
        prompt_ids=list(item.prompt_ids),
        n=n,
        lengths=lengths,
        stopped=np.fromiter((s.finish_reason == "stop" for s in samples), bool, len(samples)),
        token_ids=np.fromiter(itertools.chain.from_iterable(s.token_ids for s in samples), np.int32),
        logprobs=(
            np.fromiter(itertools.chain.from_iterable(s.logprobs for s in samples), np.float32)
            if with_lp
            else np.zeros(0, np.float32)
        ),
        prompt_tokens=np.fromiter((r.prompt_tokens for r in results), np.int32, len(results)),
        texts=[s.text for s in samples],
        gen_start=start,
        gen_end=end,
    )


def pack_segment(
    item: WorkItem, samples: list[Any], cap: int, *, gu: int, actor: int, version: int, start: float, end: float
) -> SegmentOutput:
    """Flatten a continuation call's `Sample`s (one per row of `item`) into a `SegmentOutput`; a row is finished
    when it stopped or reached `cap` tokens in all.

    Raises:
        ValueError: when the engine returned another number of rows.
    """
    rows = item.rows
    if len(samples) != len(rows):
        raise ValueError(
            f"engine continued {len(samples)} responses for {len(rows)} rows of continuation {item.task_id}"
        )
    lengths = np.fromiter((s.length for s in samples), np.int32, len(samples))
    stopped = np.fromiter((s.finish_reason == "stop" for s in samples), bool, len(samples))
    total = np.fromiter((r.generated for r in rows), np.int64, len(rows)) + lengths
    with_lp = all(len(s.logprobs) == s.length for s in samples)
    return SegmentOutput(
        cont_id=item.task_id,
        attempt=item.attempt,
        gu=gu,
        actor=actor,
        policy_version=version,
        task_ids=np.fromiter((r.task_id for r in rows), np.int64, len(rows)),
        samples=np.fromiter((r.sample for r in rows), np.int64, len(rows)),
        lengths=lengths,
        finished=stopped | (total >= cap),
        stopped=stopped,
        token_ids=np.fromiter(itertools.chain.from_iterable(s.token_ids for s in samples), np.int32),
        logprobs=(
            np.fromiter(itertools.chain.from_iterable(s.logprobs for s in samples), np.float32)
            if with_lp
            else np.zeros(0, np.float32)
        ),
        texts=[s.text for s in samples],
        gen_start=start,
        gen_end=end,
    )


class GenerationActor:
    """One engine instance; see the module docstring. Wrapped with `ray.remote` by the runtime.

    Args:
        gu: generation unit index; actor: global actor index.
        engine_factory: picklable zero-argument callable returning an `asp.rollout.Engine`.
        sampling: sampling settings used for every minibatch; each minibatch's seed is its `WorkItem.seed`.
        cwd: the driver's working directory, to work in (`asp.runtime.trainer.work_in`); None: stay.
    """

    def __init__(
        self,
        gu: int,
        actor: int,
        engine_factory: Callable[[], Any],
        sampling: SamplingParams,
        cwd: str | None = None,
    ) -> None:
        work_in(cwd)
        self.gu, self.actor, self.sampling = gu, actor, sampling
        self.version = 0
        self.load_error: str | None = None
        self.engine: Any = None
        try:
            self.engine = engine_factory()
        except Exception as exc:  # surfaced by ready(), so the driver can raise one clear error
            self.load_error = f"{type(exc).__name__}: {exc}"

    def ready(self) -> str | None:
        """None when the engine loaded, else its error message."""
        return self.load_error

    def reload(self, update: WeightUpdate) -> float:
        """Load a newer snapshot (simulated: sleep); return seconds spent. Keeps old weights on error."""
        start = time.perf_counter()
        if update.payload is None:
            if update.simulated_load_s > 0:
                time.sleep(update.simulated_load_s)
        else:
            self.engine.update_weights(resolve_weights(update.payload))
        self.version = update.version
        return time.perf_counter() - start

    def generate(
        self, items: list[WorkItem], update: WeightUpdate | None
    ) -> list[MinibatchOutput | SegmentOutput | Failure]:
        """Reload first if `update` is newer (deferred reload), then decode `items` one after the other.

        Usually one minibatch per call; the GU coalesces several only when they take milliseconds each.
        An error in one minibatch becomes its `Failure`; the others still run.
        """
        reload_s, reload_error = 0.0, ""
        if update is not None and update.version > self.version:
            try:
                reload_s = self.reload(update)
            except Exception as exc:  # keep the old weights; the GU offers the snapshot again next call
                reload_error = f"{type(exc).__name__}: {exc!s:.300}"
                log.warning("actor %d: reloading weights version %d failed: %s", self.actor, update.version, exc)
        results = [self._one(item) for item in items]
        if results and not isinstance(results[0], Failure):
            results[0].reload_s, results[0].reload_error = reload_s, reload_error
        return results

    def _one(self, item: WorkItem) -> MinibatchOutput | SegmentOutput | Failure:
        n, cap = self.sampling.n, self.sampling.max_new_tokens
        try:
            if item.is_continuation:
                return self._continue(item)
            budget = item.budget if item.budget is not None and item.budget < cap else None
            params = replace(self.sampling, seed=item.seed, max_new_tokens=budget or cap)
            start = time.time()
            results = self.engine.generate(item.prompts, params)
            end = time.time()
            out = pack_output(
                item, results, n, gu=self.gu, actor=self.actor, version=self.version, start=start, end=end
            )
            if budget is not None:  # below the cap, a response that did not stop is unfinished
                out.finished = out.stopped.copy()
            return out
        except Exception as exc:
            return self._failure(item, exc)

    def _continue(self, item: WorkItem) -> SegmentOutput:
        """Partial rollouts: the next segment of each row (`asp.rollout.base.ContinuingEngine`)."""
        if not isinstance(self.engine, ContinuingEngine):
            raise TypeError(
                f"{type(self.engine).__name__} cannot continue responses (runtime.partial needs hf or vllm)"
            )
        cap = self.sampling.max_new_tokens
        limits = [cap - r.generated for r in item.rows]
        params = replace(self.sampling, n=1, seed=item.seed, max_new_tokens=min(item.budget or cap, max(limits)))
        start = time.time()
        samples = self.engine.continue_responses(
            [r.prompt for r in item.rows], [r.token_ids.tolist() for r in item.rows], params, limits
        )
        end = time.time()
        return pack_segment(
            item, samples, cap, gu=self.gu, actor=self.actor, version=self.version, start=start, end=end
        )

    def _failure(self, item: WorkItem, exc: BaseException) -> Failure:
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" (at {last.filename}:{last.lineno})" if last else ""
        reason = f"{type(exc).__name__}: {exc}{where}"
        return Failure(item.task_id, item.attempt, self.gu, self.actor, reason, item.is_continuation)


class GenerationUnit:
    """A GU's control process (async Ray actor); see the module docstring.

    Args:
        gu: generation unit index.
        actors: Ray handles of its generation actors.
        actor_ids: their global indices.
        coalesce_below_s: when an actor's last minibatches took less than this each, hand it several queued
            minibatches per call (about this many seconds' worth) to amortize the call; real generation
            (seconds per minibatch) always gets one per call, so pause and reload act between minibatches.
        max_chunk: most minibatches per call.
    """

    def __init__(
        self, gu: int, actors: list[Any], actor_ids: list[int], coalesce_below_s: float, max_chunk: int
    ) -> None:
        self.gu, self.actors, self.actor_ids = gu, list(actors), list(actor_ids)
        self.coalesce_below_s, self.max_chunk = coalesce_below_s, max(1, max_chunk)
        self.queue: deque[WorkItem] = deque()
        self.paused = False
        self.pause_seq = -1  # sequence number of the pause state applied last
        self.next_submit = 0  # sequence number of the next `submit` to join the queue
        self.early: dict[int, list[WorkItem]] = {}  # submits that overtook an earlier one, by sequence number
        self.weights: WeightUpdate | None = None
        self.report = GUReport(gu=gu)
        self.work = asyncio.Event()  # queue non-empty and not paused, or stopping
        self.news = asyncio.Event()  # something to report
        self.running = True
        self.feeders: list[asyncio.Task] = []

    async def start(self) -> int:
        """Start one feeder per actor; returns the number of actors."""
        self.feeders = [
            asyncio.create_task(self._feed(h, a)) for h, a in zip(self.actors, self.actor_ids, strict=True)
        ]
        return len(self.feeders)

    def _wake(self) -> None:
        if (self.queue and not self.paused) or not self.running:
            self.work.set()
        else:
            self.work.clear()

    async def submit(self, items: list[WorkItem], seq: int) -> None:
        """Append minibatches to the input queue, in order. `seq` numbers the Control Unit's submits to this GU
        (0, 1, 2, ...): Ray may run a later call first, which then waits here until the ones before it arrived."""
        self.early[seq] = items
        while self.next_submit in self.early:
            self.queue.extend(self.early.pop(self.next_submit))
            self.next_submit += 1
        self._wake()

    async def set_paused(self, paused: bool, seq: int) -> None:
        """Backpressure: while paused no queued minibatch starts; decoding ones finish. `seq` numbers the Control
        Unit's pause/resume calls: one that Ray runs after a newer one (it does not keep an async actor's calls in
        order) is stale and ignored, so the GU ends in the state the Control Unit set last."""
        if seq <= self.pause_seq:
            return
        self.pause_seq, self.paused = seq, paused
        self._wake()

    async def set_weights(self, update: WeightUpdate) -> None:
        """Announce a snapshot; each actor loads it before its next minibatch (deferred reload)."""
        if self.weights is None or update.version > self.weights.version:
            self.weights = update

    async def collect(self, timeout_s: float) -> GUReport:
        """Wait up to `timeout_s` for news, then return (and clear) everything finished since the last call."""
        if not (self.report.outputs or self.report.failures or self.report.dead_actors):
            self.news.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.news.wait(), timeout_s)
        report, self.report = self.report, GUReport(gu=self.gu)
        report.queued = len(self.queue)
        return report

    async def _next_items(self, per_item_s: float) -> list[WorkItem]:
        """Wait for work; take one minibatch, or a chunk when minibatches are very short."""
        k = 1
        if per_item_s < self.coalesce_below_s:
            k = min(self.max_chunk, max(1, int(self.coalesce_below_s / max(per_item_s, 1e-6))))
        while self.running:
            await self.work.wait()
            if self.running and self.queue and not self.paused:
                items = [self.queue.popleft() for _ in range(min(k, len(self.queue)))]
                self._wake()
                return items
            self._wake()
        return []

    async def _feed(self, handle: Any, actor: int) -> None:
        import ray

        version = 0  # weights version the actor holds (0 = as built by the factory)
        per_item_s = float("inf")  # seconds per minibatch of the actor's last call
        while items := await self._next_items(per_item_s):
            update = self.weights if self.weights is not None and self.weights.version > version else None
            start = time.perf_counter()
            try:
                results = await handle.generate.remote(items, update)
            except ray.exceptions.RayActorError as exc:
                for item in items:
                    reason = f"actor died: {exc!s:.300}"
                    self._post(
                        failure=Failure(item.task_id, item.attempt, self.gu, actor, reason, item.is_continuation)
                    )
                if not await self._await_restart(handle):
                    self._post(dead=actor)
                    return
                version, per_item_s = 0, float("inf")  # a restarted actor rebuilt its engine from the factory
                continue
            per_item_s = (time.perf_counter() - start) / len(items)
            for result in results:
                if isinstance(result, Failure):
                    self._post(failure=result)
                else:
                    version = max(version, result.policy_version)
                    self._post(output=result)

    async def _await_restart(self, handle: Any) -> bool:
        """True once a restarted actor answers with a loaded engine; False if it is gone for good."""
        import ray

        for _ in range(3):
            try:
                return await handle.ready.remote() is None
            except ray.exceptions.ActorDiedError:
                return False
            except ray.exceptions.RayActorError:
                await asyncio.sleep(0.2)
        return False

    def _post(
        self,
        output: MinibatchOutput | SegmentOutput | None = None,
        failure: Failure | None = None,
        dead: int | None = None,
    ) -> None:
        if output is not None:
            self.report.outputs.append(output)
        if failure is not None:
            self.report.failures.append(failure)
        if dead is not None:
            self.report.dead_actors.append(dead)
        self.news.set()
