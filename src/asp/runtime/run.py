"""`run_async`: check inputs, start (or join) Ray, build the actors, run the Control Unit, clean up.

Everything that can be checked is checked before any actor starts (`UserError`): the schedule against the
prompt set, the config (q_max >= one global batch, ...), the engine's model directory, the Ray resources
the actors need, that the units' placement groups (`asp.runtime.placement`, ``runtime.ray.placement``) can be
placed, and finally that every engine actually loaded (its error is reported verbatim).
`ray_session` owns `ray.init` / `ray.shutdown` only when it started Ray (dashboard off, every server on
127.0.0.1), so tests and callers can share a cluster; actors are always killed on exit, Ctrl-C or SIGTERM.
A resumed run continues from the newest runtime position whose trainer checkpoint is intact
(`asp.runtime.checkpoint`; replans recorded in it are replayed); a trainer that cannot restore it stops the run
with its `UserError`. `observer` and `on_start` let a caller (the drift watch, launch) replan or stop the run.
The run log beside the checkpoint (`asp.runtime.runlog`) makes the summary cover the whole run across resumes;
`finished_run` reads back a run that finished but whose caller was killed before it was done with the end of the
run (`close_run` marks that done). A local Ray that `ray_session` starts is recorded (`asp.runtime.raysession`);
what a SIGKILLed owner left running is stopped the next time one starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import ray

from asp.control.database import Database
from asp.control.messages import MinibatchOutput
from asp.control.plan import as_plan, check_prompts
from asp.errors import UserError
from asp.rollout.base import SamplingParams
from asp.runtime.checkpoint import Checkpointer
from asp.runtime.cluster import check_resources, check_same_directory
from asp.runtime.config import RuntimeConfig
from asp.runtime.connect import join_cluster
from asp.runtime.control import ControlUnit, GUState, RunSummary, RuntimeFailure
from asp.runtime.engines import EngineSpec
from asp.runtime.generation import GenerationActor, GenerationUnit
from asp.runtime.placement import Placement, create_placement, trainer_ranks
from asp.runtime.raysession import forget_local_ray, reap_dead_sessions, record_local_ray
from asp.runtime.runlog import RunHistory, RunLog
from asp.runtime.trainer import build_training_unit, rank_handles

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def ray_session(config: RuntimeConfig) -> Iterator[bool]:
    """Use the running Ray, or start one and shut it down on exit. Yields True if started.

    Without `runtime.ray.address` the local cluster is started with the dashboard off and this node's address
    set to 127.0.0.1, so its servers (GCS, raylet, workers, runtime-env agent, the autoscaler monitor's metrics
    endpoint) listen on loopback only (tests/runtime/test_ray_network.py checks the sockets).
    """
    if ray.is_initialized():
        yield False
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if config.ray.address:
        loopback = config.ray.address.split(":")[0] in (LOOPBACK, "localhost")
        with _loopback_node_address() if loopback else contextlib.nullcontext():  # else Ray dials the node's IP
            join_cluster(config.ray.address, config.ray.connect_timeout_s)  # bounded wait, else UserError
    else:
        reap_dead_sessions()
        init_local_ray(num_cpus=config.ray.num_cpus, num_gpus=config.ray.num_gpus)
        record_local_ray()
    try:
        yield True
    finally:
        ray.shutdown()
        forget_local_ray()


RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class _TokenAuthOnNotice(logging.Filter):
    """Drops Ray's "Token authentication is enabled for this Ray cluster" notice (not a problem: the safe default)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


def init_local_ray(**options: Any) -> None:
    """Start a local Ray cluster bound to 127.0.0.1 with the dashboard off (`options` go to `ray.init`).

    Ray's notice that token authentication is on (its default for a new local cluster, warned about in every run's
    log when RAY_AUTH_MODE is unset) is dropped (`_TokenAuthOnNotice`); its warning that authentication is off
    stays. (Setting RAY_AUTH_MODE=token here instead made Ray 2.60's own workers fail to authenticate.)"""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    notices = logging.getLogger(RAY_AUTH_LOGGER)
    if not any(isinstance(f, _TokenAuthOnNotice) for f in notices.filters):
        notices.addFilter(_TokenAuthOnNotice())
    with _loopback_node_address():
        ray.init(include_dashboard=False, _node_ip_address=LOOPBACK, **options)
    node_ip = ray.util.get_node_ip_address()
    if node_ip != LOOPBACK:
        log.warning(
            "the local Ray cluster took node address %s, not %s: it listens beyond loopback", node_ip, LOOPBACK
        )


@contextlib.contextmanager
def _loopback_node_address() -> Iterator[None]:
    """While `ray.init` starts a local cluster, let 127.0.0.1 stand as this node's address.

    Ray's servers bind to the node address when it is the loopback one and to all interfaces otherwise, but on
    Linux Ray replaces a loopback ``_node_ip_address`` by the routable address
    (`ray._private.services.resolve_ip_for_localhost` -> `get_node_ip_address`) unless
    `ray_constants.ENABLE_RAY_CLUSTER` is false, as it is on macOS / Windows (environment variable
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``, read once when ray is imported, so too late to set here). The flag is
    switched off only for the duration of `ray.init` (the started processes get ``--node-ip-address=127.0.0.1``).
    """
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while the block runs (main thread only), so cleanup happens."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_runtime(
    config: RuntimeConfig, engine_factory: Callable[[], Any], trainer_factory: Callable[[], Any]
) -> tuple[list[GUState], dict[int, Any], Any, Placement]:
    """Place the units (`asp.runtime.placement`), start the generation actors, Generation Units and Training
    Unit; wait until every engine loaded.

    Returns:
        (GU states, actor index -> handle, Training Unit handle, the `Placement`; pass it to `teardown`).
        On any error all actors are killed and the placement groups removed.

    Raises:
        UserError: a placement group could not be placed, or an engine or the trainer failed to build (message
            includes its error).
    """
    sampling = SamplingParams(
        config.sampling.n_samples,
        config.sampling.max_new_tokens,
        config.sampling.temperature,
        config.sampling.top_p,
        seed=0,
    )  # seed: each task's
    placement = create_placement(config, trainer_ranks(config, trainer_factory))
    actor_cls = ray.remote(GenerationActor)
    actor_options = dict(
        num_cpus=config.ray.actor_num_cpus,
        num_gpus=config.ray.actor_num_gpus,
        max_restarts=config.ray.actor_max_restarts,
        max_task_retries=0,
    )
    handles: dict[int, Any] = {}
    owner: dict[int, int] = {}
    for g in range(config.ray.generation_units):
        for i in range(config.ray.actors_per_unit):
            a = g * config.ray.actors_per_unit + i
            options = actor_options | placement.actor_options(g, i)
            handle = actor_cls.options(**options).remote(g, a, engine_factory, sampling, os.getcwd())
            handles[a], owner[a] = handle, g
    trainer, ranks = build_training_unit(config, trainer_factory, placement)  # rank 0 leads; all ranks: rank_handles
    units: list[Any] = []
    try:
        _wait_ready(handles, owner, trainer, config.control.stall_timeout_s)
        if config.ray.address:  # a local cluster is this machine: same directory by construction
            ranks_by_name = {f"Training Unit rank {r}": h for r, h in enumerate(ranks)}
            check_same_directory({f"generation actor {a}": h for a, h in handles.items()} | ranks_by_name)
        for g in range(config.ray.generation_units):
            ids = [a for a in handles if owner[a] == g]
            units.append(
                ray.remote(GenerationUnit)
                .options(num_cpus=0, **placement.unit_options(g))
                .remote(g, [handles[a] for a in ids], ids, config.queue.coalesce_below_s, config.queue.max_chunk)
            )
        ray.get([u.start.remote() for u in units])
    except BaseException:
        teardown(units, handles, trainer, placement)
        raise
    gus = [
        GUState(g, u, [a for a in handles if owner[a] == g], {a for a in handles if owner[a] == g})
        for g, u in enumerate(units)
    ]
    return gus, handles, trainer, placement


def _wait_ready(handles: dict[int, Any], owner: dict[int, int], trainer: Any, timeout_s: float) -> None:
    """Raise `UserError` naming the first actor whose engine (or the trainer) failed or did not start in time."""
    refs = {
        f"generation actor {a} (unit {owner[a]}) could not load its engine": h.ready.remote()
        for a, h in handles.items()
    }
    refs["the Training Unit could not build its trainer"] = trainer.ready.remote()
    ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    for what, ref in refs.items():
        try:
            error = ray.get(ref, timeout=0.01)
        except ray.exceptions.GetTimeoutError:
            error = (
                f"it did not start within {timeout_s:g} s (runtime.control.stall_timeout_s); Ray may be unable to "
                "place it (resources held by other jobs) or loading is very slow"
            )
        except ray.exceptions.RayActorError as exc:
            error = f"the actor process died while starting: {exc!s:.500}"
        if error:
            raise UserError(f"{what}: {error}. Check the engine / trainer kind, model path and options.")


def teardown(units: list[Any], handles: Mapping[int, Any], trainer: Any, placement: Placement | None = None) -> None:
    """Kill the runtime's actors (no restarts), then remove its placement groups (when given)."""
    for handle in [*units, *handles.values(), *rank_handles(trainer)]:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)
    if placement is not None:
        placement.remove()


def make_checkpointer(
    plan: Any, config: RuntimeConfig, checkpoint_dir: str | Path, fingerprint_extra: Mapping[str, Any] | None = None
) -> Checkpointer:
    """The `Checkpointer` of a run: ``<checkpoint_dir>/runtime_state.json`` keyed by the plan's dispatch order,
    the global batch size, n and `fingerprint_extra`; a checkpoint of anything else is not resumed."""
    extra = dict(fingerprint_extra or {})
    fingerprint = as_plan(plan).fingerprint(
        global_batch_prompts=config.global_batch_prompts, n=config.sampling.n_samples, **extra
    )
    return Checkpointer(Path(checkpoint_dir), fingerprint)


def run_async(
    schedule: Any,
    prompts_by_id: Mapping[Any, str],
    engine_factory: Callable[[], Any],
    config: RuntimeConfig,
    *,
    trainer_factory: Callable[[], Any],
    logger: Any = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = True,
    on_iteration: Callable[[ControlUnit, dict[str, float]], None] | None = None,
    fingerprint_extra: Mapping[str, Any] | None = None,
    observer: Callable[[ControlUnit, MinibatchOutput], None] | None = None,
    on_start: Callable[[ControlUnit], None] | None = None,
) -> RunSummary:
    """Run the asynchronous generation -> Training Queue -> trainer loop over a schedule.

    Args:
        schedule: a `WorkPlan`, an `asp.schedule.Schedule`, the schedule DataFrame, or prompt-id lists.
        prompts_by_id: prompt id -> chat-templated prompt text.
        engine_factory: picklable zero-argument callable building one engine per actor (e.g. `EngineSpec`).
        config: the `RuntimeConfig`.
        trainer_factory: picklable zero-argument callable building the `Trainer`
            (`asp.trainers.make_trainer_factory`).
        logger: object with ``log_metrics(dict, step)`` (e.g. the stage's MLflow tracker); gets every
            iteration's metrics once, when the checkpoint covering the step is written (each step as it
            finishes when `checkpoint_dir` is None), and at the end the summary (step = last trainer step).
        checkpoint_dir: where ``runtime_state.json`` is kept; None disables checkpoints.
        resume: continue from an unfinished checkpoint of the same plan when there is one.
        on_iteration: called in the driver after every step with (control unit, metrics) (tests, progress).
        fingerprint_extra: settings a checkpoint must match to be resumed besides the plan, the global batch
            and n (e.g. the trainer kind and its hyper-parameters); see `make_checkpointer`.
        observer: called in the driver with (control unit, output) for every minibatch ingested the first time;
            it may call `ControlUnit.replan` or `ControlUnit.request_stop` (the drift watch).
        on_start: called with the control unit after the resume (if any) and before the first dispatch (e.g. to
            apply an accepted re-profile's plans with `ControlUnit.replan`).

    Returns:
        The `RunSummary` (``stopped`` says why when `request_stop` ended it early; the checkpoint then resumes).

    Raises:
        UserError: bad schedule / prompts / config / resources, or an engine that fails to load.
        RuntimeFailure: the run could not continue (see `asp.runtime.control.RuntimeFailure`).
    """
    plan = as_plan(schedule)
    check_prompts(plan, prompts_by_id)
    if isinstance(engine_factory, EngineSpec):
        engine_factory.check()
        tp = int(engine_factory.options.get("tensor_parallel_size", 1))
        on_cpu = engine_factory.device == "cpu"  # vLLM's CPU build: no GPU per actor
        if engine_factory.kind == "vllm" and not on_cpu and config.ray.actor_num_gpus < tp:
            raise UserError(
                f"vLLM actors with tensor_parallel_size={tp} need runtime.ray.actor_num_gpus >= {tp}, "
                f"got {config.ray.actor_num_gpus:g}."
            )
    epochs = 1 if config.iterations is None else None
    db = Database(plan, prompts_by_id, epochs=epochs, max_attempts=config.control.max_attempts, seed=config.seed)
    checkpointer, state, reason, runlog = None, None, "fresh run", None
    if checkpoint_dir is not None:
        checkpointer = make_checkpointer(plan, config, checkpoint_dir, fingerprint_extra)
        runlog = RunLog(checkpoint_dir)
        if resume:
            state, reason = checkpointer.load()
            if state is None and reason != "no checkpoint":
                log.warning("not resuming from %s: %s; starting fresh", checkpointer.path, reason)
        if state is None:
            runlog.reset()
    with ray_session(config), _sigterm_as_interrupt():  # after ray.init, which installs its own handler
        check_resources(config)
        gus, handles, trainer, placement = build_runtime(config, engine_factory, trainer_factory)
        try:
            cu = ControlUnit(
                config,
                db,
                gus,
                trainer,
                logger,
                checkpointer,
                on_iteration,
                actor_handles=handles,
                observer=observer,
                runlog=runlog,
            )
            cu.resume_reason = reason
            if state is not None:
                _restore(cu, trainer, state)
            if on_start is not None:
                on_start(cu)
            try:
                summary = cu.run()
            except RuntimeFailure as exc:
                raise RuntimeFailure(_how_to_resume(str(exc), cu)) from exc
        finally:
            teardown([g.handle for g in gus], handles, trainer, placement)
    if logger is not None:
        logger.log_metrics(summary.metrics, step=summary.trainer_step)
        if runlog is not None and summary.finished:
            runlog.mark("summary_logged", summary.trainer_step)
    return summary


def _how_to_resume(failure: str, cu: ControlUnit) -> str:
    """The failure, where the run stopped and what a rerun resumes from (the last checkpoint, if any)."""
    text = f"{failure}. The run stopped at trainer step {cu.step}"
    if cu.checkpointer is None:
        return f"{text}; without runtime checkpoints (no checkpoint_dir) a rerun starts afresh."
    try:
        state, _ = cu.checkpointer.load()
    except UserError as exc:
        return f"{text}; its checkpoint cannot be resumed: {exc}"
    if state is None:
        return f"{text}, before its first checkpoint ({cu.checkpointer.path}): a rerun starts afresh."
    return (
        f"{text}; a rerun with the same params (after a lost node: once the cluster can place every unit again) "
        f"resumes from the checkpoint of step {state['trainer_step']} ({cu.checkpointer.path}) and trains nothing "
        "twice."
    )


def finished_run(
    plan: Any, config: RuntimeConfig, checkpoint_dir: str | Path, fingerprint_extra: Mapping[str, Any] | None = None
) -> tuple[RunSummary, RunHistory] | None:
    """A run of this plan that finished (its last position says so) but was not closed (`close_run`): its caller was
    killed after the last step and before it was done with the end of the run. Returns its whole-run `RunSummary`
    and `RunHistory` (from the run log); None for anything else (no checkpoint, an unfinished or closed run, a run
    log without the finished summary). Nothing is logged or written."""
    state = make_checkpointer(plan, config, checkpoint_dir, fingerprint_extra).load_finished()
    if state is None:
        return None
    history = RunLog(checkpoint_dir).read(int(state["trainer_step"]))
    if history.closed or history.summary is None or int(history.summary["trainer_step"]) != state["trainer_step"]:
        return None
    return RunSummary.from_record(history.summary, history.iterations, history.records), history


def log_finished(checkpoint_dir: str | Path, summary: RunSummary, history: RunHistory, logger: Any) -> None:
    """Log what of a `finished_run` a kill kept from `logger`: the steps after the last logged one, then the
    summary metrics (each noted in the run log, so a further kill does not log them twice)."""
    runlog = RunLog(checkpoint_dir)
    if history.unlogged:
        for step, metrics in history.unlogged:
            logger.log_metrics(metrics, step=step)
        runlog.mark("logged", summary.trainer_step)
    if not history.summary_logged:
        logger.log_metrics(summary.metrics, step=summary.trainer_step)
        runlog.mark("summary_logged", summary.trainer_step)


def close_run(checkpoint_dir: str | Path, step: int) -> None:
    """Note in the run log that the caller is done with the end of the run (the next run starts fresh)."""
    RunLog(checkpoint_dir).mark("closed", step)


def _restore(cu: ControlUnit, trainer: Any, state: Mapping[str, Any]) -> None:
    """Put the Control Unit and the trainer at the checkpointed position (the same step for both).

    Raises:
        UserError: the trainer could not restore its checkpoint (its own `UserError`, or the error named).
    """
    cu.db.restore(state["database"])
    cu.restore_position(int(state["trainer_step"]), int(state["policy_version"]))
    cu.trainer_state = dict(state["trainer_state"])
    if cu.runlog is not None:
        cu.resume_history(cu.runlog.restore(cu.step, state["database"].get("consumed", {})))
    try:
        update = ray.get(trainer.restore.remote(cu.trainer_state))
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        if isinstance(cause, UserError):
            raise UserError(str(cause)) from None
        where = cu.checkpointer.path if cu.checkpointer is not None else "the runtime checkpoint"
        raise UserError(
            f"the Training Unit could not restore the trainer state of step {cu.step} named in {where}: "
            f"{type(cause).__name__}: {cause!s:.1000}. Delete the trainer checkpoint it names to resume from the "
            "previous one, or the runtime state directory to start afresh."
        ) from None
    if update is not None:
        ray.get([g.handle.set_weights.remote(update) for g in cu.gus])
