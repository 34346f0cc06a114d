"""The driver process of the multi-node tests (tests/runtime/test_multinode.py): one `run_async` run joined to an
existing Ray cluster through ``runtime.ray.address``, in its own process (the pytest process may hold a Ray of its
own, and the test kills nodes while this runs).

    python tests/runtime/multinode_driver.py SPEC.json

SPEC: {"address", "work" (the run's directory: checkpoint, ledger, gate), "minibatches", "size", "config" (runtime
overrides of `helpers.fast_config`), "holds" (engine call numbers after which calls wait for the next "release"
tick of the gate), "hold_step" (a trainer step that waits for a "release_tu" tick), "result" (file written)}.
With ``"mode": "profile"`` it runs the profile stage instead (`profile_main`: "policy", "prompts" directories,
"profile" and "runtime" params overrides, "holds").

Every generation actor's engine and the trainer write where they run (node id, placement group) to
``<work>/gate/where-<pid>.json``; the result file has the run's summary (or the failure), the session start
(``t0``, wall clock), its events, and Ray's placement group table. Exit 0: finished; 3: `RuntimeFailure` (the
message is in the result and on stderr); 2: `UserError`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import helpers  # noqa: E402  (tests/runtime/helpers.py: registered for pickling by value)
from ray import cloudpickle as ray_cloudpickle  # noqa: E402

from asp.config import deep_merge  # noqa: E402
from asp.errors import UserError  # noqa: E402
from asp.runtime import RuntimeFailure, run_async  # noqa: E402


def _where(gate_dir: str, kind: str) -> None:
    """Note in the gate directory on which node (and in which placement group) this actor runs."""
    import ray

    ctx = ray.get_runtime_context()
    record = {"kind": kind, "node": ctx.get_node_id(), "pg": ctx.get_placement_group_id(), "pid": os.getpid()}
    path = Path(gate_dir) / f"where-{os.getpid()}.json"
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").replace(path)


class HoldingEngine(helpers.StandInEngine):
    """Stand-in engine counting its calls in the gate; call c waits until the gate's "release" count reaches the
    number of `holds` below c (so the test can kill a node while chosen calls are in flight)."""

    def __init__(self, gate_dir: str, holds: list[int], **options: Any) -> None:
        super().__init__(**options)
        self.gate, self.holds = helpers.Gate(gate_dir), sorted(holds)
        _where(gate_dir, "actor")

    def generate(self, prompts: list[str], params: Any) -> list[Any]:
        call = self.gate.tick("calls")
        need = sum(call > h for h in self.holds)
        if need:
            self.gate.wait(lambda g: g.count("release") >= need, f"release {need} of call {call}", timeout_s=300)
        return super().generate(prompts, params)


def _holding_engine(gate_dir: str, holds: list[int], options: dict) -> HoldingEngine:
    return HoldingEngine(gate_dir, holds, **options)


def _may_step(gate: helpers.Gate, step: int, *, hold_step: int | None) -> bool:
    """The trainer's step `hold_step` waits for a "release_tu" tick (it ticks "tu_hold" first); others run."""
    if step != hold_step:
        return True
    if gate.count("tu_hold") == 0:
        gate.tick("tu_hold")
    return gate.count("release_tu") > 0


class WhereTrainer(helpers.GatedTrainer):
    """`GatedTrainer` (ledger, instant steps) that notes its node like the engines."""

    def __init__(self, gate_dir: str, may_step: Any, ledger_path: str) -> None:
        super().__init__(gate_dir, may_step, ledger_path)
        _where(gate_dir, "trainer")


class HoldingWrapper:
    """A real engine (built by `factory` in the actor) whose `generate` calls are counted and held like
    `HoldingEngine`'s; everything else is the engine's."""

    def __init__(self, factory: Any, gate_dir: str, holds: list[int]) -> None:
        self.inner, self.gate, self.holds = factory(), helpers.Gate(gate_dir), sorted(holds)
        _where(gate_dir, "actor")

    def generate(self, prompts: list[str], params: Any) -> list[Any]:
        call = self.gate.tick("calls")
        need = sum(call > h for h in self.holds)
        if need:
            self.gate.wait(lambda g: g.count("release") >= need, f"release {need} of call {call}", timeout_s=300)
        return self.inner.generate(prompts, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class HoldingFactory:
    """Picklable engine factory wrapping the profile stage's `EngineSpec` (checked as the spec is)."""

    def __init__(self, spec: Any, gate_dir: str, holds: list[int]) -> None:
        self.spec, self.gate_dir, self.holds = spec, gate_dir, holds

    def check(self) -> None:
        getattr(self.spec, "check", lambda: None)()

    def __call__(self) -> HoldingWrapper:
        return HoldingWrapper(self.spec, self.gate_dir, self.holds)


ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])


def profile_main(spec: dict[str, Any]) -> int:
    """The profile stage (`asp.pipeline.profile.run`) on Ray actors of the cluster at ``spec["address"]``, its
    engines held at ``spec["holds"]``; the result file lists the minibatches it sent (`WorkItem` ids)."""
    from asp.config import Params, validate_params
    from asp.pipeline import profile
    from asp.runtime import profile_actors
    from asp.steps.paths import rebase
    from asp.tracking import NullTracker

    work, gate = Path(spec["work"]), str(Path(spec["work"]) / "gate")
    Path(gate).mkdir(parents=True, exist_ok=True)
    raw = Params.defaults().model_dump(mode="json")
    raw["profile"] |= spec["profile"]
    raw["runtime"] = deep_merge(raw["runtime"], deep_merge(spec["runtime"], {"ray": {"address": spec["address"]}}))
    params = validate_params(raw, "multinode profile")
    paths = rebase(profile.Paths(policy=Path(spec["policy"]), prompts=Path(spec["prompts"])), work)
    real_runner, real_item, sent = profile_actors.profile_runner, profile_actors.WorkItem, []

    def holding_runner(runtime: Any, actors: Any, engine_factory: Any, sampling: Any) -> Any:
        return real_runner(runtime, actors, HoldingFactory(engine_factory, gate, spec.get("holds", [])), sampling)

    def recorded(*args: Any) -> Any:
        sent.append(args[1])  # the minibatch id
        return real_item(*args)

    profile_actors.profile_runner, profile_actors.WorkItem = holding_runner, recorded
    profile.profile_runner = holding_runner  # the stage's own name for it (imported at the top of its module)
    result: dict[str, Any] = {}
    code = 0
    try:
        result["metrics"] = profile.run(params, paths, NullTracker())
    except UserError as exc:
        result["user_error"], code = str(exc), 2
        print(f"error: {exc}", file=sys.stderr)
    result["sent"], result["ended"] = sent, time.time()
    out = Path(spec["result"])
    out.with_suffix(".tmp").write_text(json.dumps(result, default=str))
    out.with_suffix(".tmp").replace(out)
    return code


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("mode") == "profile":
        return profile_main(spec)
    work = Path(spec["work"])
    gate = work / "gate"
    gate.mkdir(parents=True, exist_ok=True)
    plan, prompts = helpers.make_plan(spec["minibatches"], spec["size"])
    config = helpers.fast_config(**deep_merge(spec.get("config", {}), {"ray": {"address": spec["address"]}}))
    engine = functools.partial(_holding_engine, str(gate), spec.get("holds", []), {"seconds_per_call": 0.01})
    may_step = functools.partial(_may_step, hold_step=spec.get("hold_step"))
    trainer = functools.partial(WhereTrainer, str(gate), may_step, str(work / "ledger.jsonl"))
    seen: dict[str, Any] = {}

    def on_start(cu: Any) -> None:
        import ray

        seen["placement_groups"] = {
            pg_id: {"name": row["name"], "bundles_to_node_id": row["bundles_to_node_id"], "state": row["state"]}
            for pg_id, row in ray.util.placement_group_table().items()
            if row["state"] == "CREATED"
        }
        seen["cu"] = cu

    result: dict[str, Any] = {}
    code = 0
    try:
        summary = run_async(
            plan, prompts, engine, config, trainer_factory=trainer, checkpoint_dir=work / "ck", on_start=on_start
        )
        result["summary"] = {
            "finished": summary.finished,
            "trainer_step": summary.trainer_step,
            "resumed_from_step": summary.resumed_from_step,
            "metrics": summary.metrics,
            "minibatches": summary.minibatches,
        }
    except RuntimeFailure as exc:
        result["failure"], code = str(exc), 3
        print(f"error: {exc}", file=sys.stderr)
    except UserError as exc:
        result["user_error"], code = str(exc), 2
        print(f"error: {exc}", file=sys.stderr)
    cu = seen.pop("cu", None)
    if cu is not None:
        result["t0"], result["events"] = cu.t0, [list(e) for e in cu.core.events]
    result["placement_groups"] = seen.get("placement_groups", {})
    result["ended"] = time.time()
    out = Path(spec["result"])
    out.with_suffix(".tmp").write_text(json.dumps(result, default=str))
    out.with_suffix(".tmp").replace(out)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
