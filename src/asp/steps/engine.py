"""Build the generation engine from params, written once: the options of an hf or vLLM engine from the
``profile:`` params (the profile stage and re-profiling) or from ``runtime.engine`` (the launch's actors).

`engine_options` is the one mapping of params to engine keyword options; `profile_engine` builds the engine
that profiles (`asp.rollout.make_engine`), `profile_engine_spec` the same engine as a picklable recipe (the profiling
actors', ``profile.actors`` > 1), `engine_spec` the picklable recipe every generation actor of the launch builds its
engine from (`asp.runtime.EngineSpec`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from asp.config import ProfileParams, RuntimeParams, VllmParams
from asp.runtime import EngineSpec

if TYPE_CHECKING:
    from asp.rollout import Engine


def engine_options(
    kind: str, device: str, dtype: str, num_threads: int | None, vllm: VllmParams, *, seed: int | None = None
) -> dict[str, Any]:
    """Keyword options of an engine of `kind`: device, dtype and threads for hf; for vllm every field of `vllm`
    (``profile.vllm``, or ``runtime.engine.vllm`` with its weight-transfer settings), `dtype`, and `seed` when
    given."""
    if kind != "vllm":
        return {"device": device, "dtype": dtype, "num_threads": num_threads}
    # the params' model is the engine's (`asp.rollout.vllm.VLLMOptions` extends it): its fields pass as they are
    opts: dict[str, Any] = {**vllm.model_dump(), "dtype": dtype}
    if seed is not None:
        opts["seed"] = seed
    return opts


def profile_engine(prof: ProfileParams, model_path: Path, seed: int) -> Engine:
    """The engine `profile.engine` names for `model_path` (vLLM seeded with `seed`), built in this process."""
    return profile_engine_spec(prof, model_path, seed)()


def profile_engine_spec(prof: ProfileParams, model_path: Path, seed: int) -> EngineSpec:
    """The picklable recipe of `profile_engine` (the same engine and options), which each profiling actor of
    ``profile.actors`` > 1 builds its engine from."""
    opts = engine_options(prof.engine, prof.device, prof.dtype, prof.num_threads, prof.vllm, seed=seed)
    return EngineSpec(prof.engine, str(model_path), opts)


def engine_spec(runtime: RuntimeParams, model_path: Path) -> EngineSpec:
    """The picklable `EngineSpec` every generation actor of the launch builds its engine from."""
    engine = runtime.engine
    return EngineSpec(
        engine.kind,
        str(model_path),
        engine_options(engine.kind, engine.device, engine.dtype, engine.num_threads, engine.vllm),
        device=engine.device,
    )
