"""The driver process of the multi-node tests (tests/runtime/test_multinode.py): one `run_async` run joined to an
existing Ray cluster through ``runtime.ray_address``, in its own process (the pytest process may hold a Ray of its
own, and the test kills nodes while this runs).

    python tests/runtime/multinode_driver.py SPEC.json

SPEC: {"address", "work" (the run's directory: checkpoint, ledger, gate), "minibatches", "size", "config" (runtime
overrides of `helpers.fast_config`), "holds" (engine call numbers after which calls wait for the next "release"
tick of the gate), "hold_step" (a trainer step that waits for a "release_tu" tick), "result" (file written)}.

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


ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    work = Path(spec["work"])
    gate = work / "gate"
    gate.mkdir(parents=True, exist_ok=True)
    plan, prompts = helpers.make_plan(spec["minibatches"], spec["size"])
    config = helpers.fast_config(ray_address=spec["address"], **spec.get("config", {}))
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
