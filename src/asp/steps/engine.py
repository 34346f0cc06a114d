"""Build the generation engine from params, written once: the options of an hf or vLLM engine from
``profile.engine`` (the profile stage and re-profiling) or ``runtime.engine`` (the launch's actors), one
`asp.config.EngineParams` shape in both.

`engine_options` is the one mapping of params to engine keyword options; `profile_engine` builds the engine
that profiles (`asp.rollout.make_engine`), `profile_engine_spec` the same engine as a picklable recipe (the profiling
actors', ``profile.actors`` > 1), `engine_spec` the picklable recipe every generation actor of the launch builds its
engine from (`asp.runtime.EngineSpec`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from asp.config import EngineParams, ProfileParams, RuntimeParams
from asp.runtime import EngineSpec

if TYPE_CHECKING:
    from asp.rollout import Engine


def engine_options(engine: EngineParams, *, seed: int) -> dict[str, Any]:
    """Keyword options of the engine `engine` describes: device, dtype and threads for hf; for vllm every field
    of ``engine.vllm`` (with the weight-transfer settings under ``runtime.engine``), the dtype, the threads (those
    of vLLM's CPU build in the engine's process: `asp.rollout.vllm.cpu_threads`) and the engine `seed` (vLLM's
    own; every request carries a seed of its own)."""
    kind, device, dtype, num_threads, vllm = engine.kind, engine.device, engine.dtype, engine.num_threads, engine.vllm
    if kind != "vllm":
        return {"device": device, "dtype": dtype, "num_threads": num_threads}
    # the params' model is the engine's (`asp.rollout.vllm.VLLMOptions` extends it): its fields pass as they are
    return {**vllm.model_dump(), "dtype": dtype, "seed": seed, "num_threads": num_threads}


def profile_engine(prof: ProfileParams, model_path: Path, seed: int) -> Engine:
    """The engine `profile.engine` names for `model_path` (vLLM seeded with `seed`), built in this process."""
    return profile_engine_spec(prof, model_path, seed)()


def profile_engine_spec(prof: ProfileParams, model_path: Path, seed: int) -> EngineSpec:
    """The picklable recipe of `profile_engine` (the same engine and options), which each profiling actor of
    ``profile.actors`` > 1 builds its engine from."""
    return EngineSpec(prof.engine.kind, str(model_path), engine_options(prof.engine, seed=seed))


def engine_spec(runtime: RuntimeParams, model_path: Path) -> EngineSpec:
    """The picklable `EngineSpec` every generation actor of the launch builds its engine from."""
    engine = runtime.engine
    return EngineSpec(
        engine.kind,
        str(model_path),
        engine_options(engine, seed=0),  # the engine's own seed, as before: each request is seeded (task seeds)
        device=engine.device,
    )
