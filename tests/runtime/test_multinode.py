"""`launch`'s runtime and the 2-actor `profile` on a real multi-node Ray cluster on this machine: placement per node,
node loss, loopback.

The cluster (`ray.cluster_utils.Cluster`, Ray's own multi-node test harness) is a head node without CPUs (GCS and
the driver's raylet: what a real cluster's head is) and three worker nodes, each its own raylet, object store and
agents on 127.0.0.1, with distinct custom resources: ``gen_a`` and ``gen_b`` {CPU: 1, asp_rollout: 1} for the
Generation Units and ``train`` {CPU: 1, asp_train: 1} for the Training Unit (``runtime.ray.actor_resources`` /
``trainer_resources`` pin the units to them). Each run is in a separate driver process
(tests/runtime/multinode_driver.py) joined through ``runtime.ray.address``; a gate (`helpers.Gate`) holds chosen
engine calls or a trainer step so that a node is lost (SIGKILL of its raylet, agents and workers at once) while
known work is in flight on it. The GCS declares a node dead after 3 missed health checks 1 s apart (Ray's default is
5 x 3 s); the numbers printed (run with -s) are detection + recovery times under that setting.

launch, one sequence: each GU's bundles (and the actors inside, as they report themselves) PACK on one rollout node,
the Training Unit on the train node; every listening socket of the cluster's processes and of the driver is on
loopback; losing gen_a re-issues its GU's minibatches to the other GU and the run goes on; losing gen_b (no unit
left) stops the run with one message naming the checkpoint it resumes from; on the cluster made whole the rerun
resumes there, and losing the train node in the middle of a step stops it the same way; the third run finishes
with every prompt trained exactly once (the trainer ledger, where a step trained again after a resume counts once:
its first training was rolled back with the trainer's state). profile (2 engine actors, one per rollout node): the
minibatch in flight on a lost node goes to the other actor; with both lost at most the minibatch in flight is lost,
finished chunks are kept, and the rerun generates only the missing minibatches, ending with the bytes of one
uninterrupted in-process engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .helpers import Gate, read_ledger
from .test_ray_network import is_loopback

DRIVER = Path(__file__).with_name("multinode_driver.py")
KEEPER = Path(__file__).with_name("multinode_cluster.py")
NODES = {
    "gen_a": {"num_cpus": 1, "resources": {"asp_rollout": 1, "node_gen_a": 1}},
    "gen_b": {"num_cpus": 1, "resources": {"asp_rollout": 1, "node_gen_b": 1}},
    "train": {"num_cpus": 1, "resources": {"asp_train": 1, "node_train": 1}},
}
PINNED = {  # 2 GUs x 2 actors (0.5 CPU + 0.5 asp_rollout each: one GU fills one rollout node), the TU on `train`
    "checkpoint_interval": 2,
    "queue": {"gu_queue_target": 2, "coalesce_below_s": 0.0},
    "control": {"stall_timeout_s": 120.0},
    "ray": {
        "generation_units": 2,
        "actors_per_unit": 2,
        "actor_num_cpus": 0.5,
        "actor_resources": {"asp_rollout": 0.5},
        "trainer_resources": {"asp_train": 1},
    },
}
MINIBATCHES, SIZE = 24, 2  # 48 prompts; global batches of 8 -> 6 steps


class MultiNode:
    """The test cluster, kept by its own process (tests/runtime/multinode_cluster.py): nodes by label, lost and added
    back."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(KEEPER), json.dumps(NODES)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.address, self.nodes = "", {}
        self.drivers: list[subprocess.Popen] = []  # stopped at teardown if a failed test left one running
        self.whole()

    def ask(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"the cluster keeper exited ({self.proc.wait()}) on {op}")
        return json.loads(line)

    def whole(self) -> None:
        """Add every labelled node that is missing (a new raylet with the same resources)."""
        reply = self.ask("whole")
        self.address, self.nodes = reply["address"], reply["nodes"]

    def kill(self, label: str) -> float:
        """Lose node `label` (SIGKILL of its raylet, agents and workers at once); returns when (time.time())."""
        self.nodes.pop(label)
        return float(self.ask("kill", label=label)["killed"])

    def label_of(self, node_id: str) -> str:
        return next((label for label, node in self.nodes.items() if node == node_id), node_id)

    def pids(self) -> set[int]:
        """The processes Ray started for the cluster's nodes (GCS, raylets, agents, ...)."""
        return set(self.ask("pids")["pids"])

    def shutdown(self) -> None:
        for driver in self.drivers:
            if driver.poll() is None:
                driver.kill()
                driver.wait(30)
        with contextlib.suppress(Exception):
            self.ask("shutdown")
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def cluster():
    ray_tmp = tempfile.mkdtemp(prefix="asp-mn-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    # Ray writes the cluster's address to $RAY_TMPDIR/ray/ray_current_cluster: never to /tmp/ray, where any other
    # ray.init() on the machine would find and join it
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env |= {"RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0"}
    multi = MultiNode(env)
    try:
        yield multi
    finally:
        multi.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def start_driver(multi: MultiNode, work: Path, name: str, **spec: Any) -> tuple[subprocess.Popen, Path]:
    work.mkdir(parents=True, exist_ok=True)
    full = {"address": multi.address, "work": str(work), "minibatches": MINIBATCHES, "size": SIZE}
    full |= {"config": PINNED, "result": str(work / f"{name}.json"), **spec}
    (work / f"{name}.spec.json").write_text(json.dumps(full))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    with (work / f"{name}.log").open("w") as log:  # the driver writes to its own copy of the file descriptor
        cmd = [sys.executable, str(DRIVER), str(work / f"{name}.spec.json")]
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    multi.drivers.append(proc)
    return proc, work / f"{name}.json"


def finish(proc: subprocess.Popen, result: Path, timeout_s: float = 240) -> tuple[int, dict]:
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(
            f"the driver did not end within {timeout_s:g} s:\n{result.with_suffix('.log').read_text()[-3000:]}"
        )
    if not result.exists():
        pytest.fail(f"the driver exited {code} without a result:\n{driver_log(result)}")
    return code, json.loads(result.read_text())


def driver_log(result: Path) -> str:
    return result.with_suffix(".log").read_text()[-3000:]


def checkpoint_step(work: Path) -> int:
    path = work / "ck" / "runtime_state.json"
    return int(json.loads(path.read_text())["trainer_step"]) if path.exists() else 0


def effective_ledger(work: Path) -> tuple[Counter, int]:
    """(trained count per prompt, counting each step once: the last training of a step a resume trained again,
    prompts trained again after a rollback)."""
    lines = read_ledger(work / "ledger.jsonl")
    last = {line["step"]: line for line in lines}  # a resumed session's step replaces the rolled-back one
    counts = Counter(pid for line in last.values() for pid in line["prompt_ids"])
    retrained = sum(len(line["prompt_ids"]) for line in lines) - sum(counts.values())
    return counts, retrained


def wait_for(what: str, ok, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if proc.poll() is not None:
            pytest.fail(f"the driver exited {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(0.05)


def where(work: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (work / "gate").glob("where-*.json")]


def listening_beyond_loopback(pids: set[int]) -> tuple[list, set[str]]:
    """(non-loopback listening sockets, names of processes with a listening socket) of `pids` and their children."""
    import socket

    import psutil

    procs: dict[int, Any] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                procs[proc.pid] = proc
        except psutil.Error:
            continue
    exposed, names = [], set()
    for proc in procs.values():
        try:
            conns = proc.net_connections(kind="inet")
            name = os.path.basename(proc.cmdline()[0]) if proc.cmdline() else proc.name()
        except psutil.Error:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and c.laddr and not c.raddr):
                names.add(name)
                if not is_loopback(c.laddr.ip):
                    exposed.append((name, proc.pid, c.laddr.ip, c.laddr.port))
    return exposed, names


def recovery(result: dict, killed: float) -> dict[str, float]:
    """Seconds from the kill to the first re-issue of a lost minibatch ('send' of attempt >= 1), to the first
    minibatch delivered after that and to the first training step finished after that."""
    t0, events = result["t0"], result["events"]
    resent = min(t0 + e[0] for e in events if e[1] == "send" and e[5] >= 1)
    first = {
        kind: min((t0 + e[0] for e in events if e[1] == kind and t0 + e[0] >= resent), default=float("nan"))
        for kind in ("recv", "trained")
    }
    return {"reissued": resent - killed, "delivered": first["recv"] - killed, "trained": first["trained"] - killed}


@pytest.mark.slow
def test_launch_placed_per_node_survives_a_rollout_node_and_resumes_after_losing_the_rest(cluster, tmp_path):
    cluster.whole()
    work = tmp_path / "launch"
    gate = Gate(work / "gate")
    # calls 1-4 run; 5-8 (one per actor) hold until release 1; 9-16 run; 17.. hold until release 2
    proc, result_path = start_driver(cluster, work, "first", holds=[4, 16])
    wait_for("every actor holding a minibatch", lambda: gate.count("calls") >= 8, proc)

    # placement as the actors see it: each GU's two actors on one rollout node, the trainer on `train`
    seen = where(work)
    cluster_labels = {node: label for label, node in cluster.nodes.items()}
    actors = [w for w in seen if w["kind"] == "actor"]
    trainers = [w for w in seen if w["kind"] == "trainer"]
    by_group: dict[str, set[str]] = {}
    for w in actors:
        by_group.setdefault(w["pg"], set()).add(cluster.label_of(w["node"]))
    assert len(actors) == 4 and sorted(map(sorted, by_group.values())) == [["gen_a"], ["gen_b"]], by_group
    assert [cluster.label_of(w["node"]) for w in trainers] == ["train"]

    # every listening socket of the cluster's processes, its workers and the driver is on loopback
    exposed, names = listening_beyond_loopback(cluster.pids() | {proc.pid})
    assert exposed == []
    assert {"gcs_server", "raylet"} <= names, names  # not vacuous

    killed_a = cluster.kill("gen_a")  # its GU holds 2 minibatches (calls 5-8) in flight
    log = work / "first.log"
    wait_for("the loss seen", lambda: "was lost (" in log.read_text(), proc)  # its work back in the Database
    gate.tick("release")
    # the other GU takes over; the run trains on to a checkpoint, then that node goes too
    wait_for("step 2 checkpointed after the loss", lambda: checkpoint_step(work) >= 2, proc)
    wait_for("gen_b's actors holding again", lambda: gate.count("calls") >= 18, proc)
    killed_b = cluster.kill("gen_b")
    gate.tick("release")
    code, first = finish(proc, result_path)
    assert code == 3, first
    message = first["failure"]
    assert re.match(r"no generation unit is left: generation unit \d was lost \(.*node", message), message
    saved = checkpoint_step(work)
    assert f"resumes from the checkpoint of step {saved} " in message, message
    assert message.count("\n") == 0  # one message, no traceback

    # placement as Ray recorded it: each GU's group on one node (PACK), one group per rollout node
    groups = {row["name"].split("-")[1]: row["bundles_to_node_id"] for row in first["placement_groups"].values()}
    gu_nodes = {unit: {n for n in nodes.values()} for unit, nodes in groups.items() if unit.startswith("gu")}
    assert sorted(len(nodes) for nodes in gu_nodes.values()) == [1, 1] and len(set.union(*gu_nodes.values())) == 2
    assert {n for nodes in gu_nodes.values() for n in nodes} == {w["node"] for w in actors}

    # the minibatches lost with gen_a's unit went to the other unit
    unit_of_group = {pg: row["name"].split("-")[1] for pg, row in first["placement_groups"].items()}
    on_a = {unit_of_group[w["pg"]] for w in actors if cluster_labels[w["node"]] == "gen_a"}
    resent_to = {f"gu{e[2]}" for e in first["events"] if e[1] == "send" and e[5] >= 1}
    assert len(on_a) == 1 and resent_to and on_a.isdisjoint(resent_to), (on_a, resent_to)
    times = recovery(first, killed_a)
    print(
        f"\n[multinode] gen_a lost: its minibatches re-issued after {times['reissued']:.2f} s, the next one delivered "
        f"after {times['delivered']:.2f} s, the next step trained after {times['trained']:.2f} s"
    )
    print(f"[multinode] gen_b lost: the run stopped {first['ended'] - killed_b:.2f} s later at checkpoint {saved}")

    # the cluster whole again (two new rollout nodes): the rerun resumes there; its Training Unit's node goes too
    cluster.whole()
    hold = saved + 1
    proc, result_path = start_driver(cluster, work, "second", hold_step=hold)
    wait_for(f"the trainer inside step {hold}", lambda: gate.count("tu_hold") >= 1, proc)
    killed_t = cluster.kill("train")
    code, second = finish(proc, result_path)
    assert code == 3, second
    message = second["failure"]
    assert message.startswith(f"the Training Unit was lost during step {hold} (") and "node" in message, message
    assert message.count("\n") == 0 and f"resumes from the checkpoint of step {saved} " in message, message
    assert checkpoint_step(work) == saved
    print(
        f"[multinode] train node lost: the run stopped {second['ended'] - killed_t:.2f} s later at checkpoint {saved}"
    )

    cluster.whole()  # a new train node
    started = time.time()
    proc, result_path = start_driver(cluster, work, "third")
    code, third = finish(proc, result_path)
    assert code == 0, third
    summary = third["summary"]
    assert summary["finished"] and summary["resumed_from_step"] == saved and summary["trainer_step"] == 6
    counts, retrained = effective_ledger(work)
    assert counts == Counter(range(MINIBATCHES * SIZE))  # none lost, none trained twice
    print(
        f"[multinode] rerun resumed at step {saved} and finished in {time.time() - started:.1f} s; prompts lost 0, "
        f"duplicated 0 ({retrained} trained again after rollbacks to the checkpoint)"
    )


PROFILE = {
    "n_samples": 2,
    "max_new_tokens": 8,
    "minibatch_prompts": 2,
    "chunk_minibatches": 1,
    "engine": {"num_threads": 1},
}
PROFILE_RUNTIME = {  # launch's layout: 2 GUs x 1 engine actor, one per rollout node; a dead actor stays dead
    "control": {"stall_timeout_s": 120.0},
    "ray": {
        "generation_units": 2,
        "actors_per_unit": 1,
        "actor_num_cpus": 0.5,
        "actor_resources": {"asp_rollout": 1},
        "actor_max_restarts": 0,
    },
}
PROFILE_PROMPTS = {"profile": 12, "heldout": 4}  # 16 prompts: 8 minibatches of 2, one chunk each


def profile_inputs(root: Path, model: Path) -> tuple[Path, Path]:
    """A policy directory naming `model` and the prompts directory the profile stage reads."""
    import pandas as pd

    policy, prompts = root / "policy", root / "prompts"
    policy.mkdir(parents=True)
    prompts.mkdir(parents=True)
    (policy / "policy.json").write_text(json.dumps({"model_path": str(model), "sha256": "tiny-qwen"}))
    start = 0
    for role, n in PROFILE_PROMPTS.items():
        ids = range(start, start + n)
        texts = [f"w{i % 40} w{(7 * i) % 40} w{(3 * i) % 40} #{i}" for i in ids]
        frame = pd.DataFrame({"prompt_id": [f"p{i}" for i in ids], "prompt": texts})
        frame.to_parquet(prompts / f"{role}.parquet")
        start += n
    return policy, prompts


def saved_chunks(work: Path) -> set[int]:
    return {int(p.stem.split("_")[1]) for p in (work / "outputs" / ".work").rglob("chunk_*.parquet")}


@pytest.mark.slow
@pytest.mark.extended  # a lost profile actor on one machine: tests/pipeline/test_profile_ray.py
def test_profile_on_two_nodes_loses_at_most_the_minibatches_in_flight(cluster, tmp_path, tiny_qwen, monkeypatch):
    from asp.config import Params, validate_params
    from asp.pipeline import profile
    from asp.steps.paths import rebase
    from asp.tracking import NullTracker

    cluster.whole()
    policy, prompts = profile_inputs(tmp_path, tiny_qwen)
    raw = Params.defaults().model_dump(mode="json")
    raw["profile"] |= PROFILE
    reference = rebase(profile.Paths(policy=policy, prompts=prompts), tmp_path / "reference")
    profile.run(validate_params(raw, "reference"), reference, NullTracker())  # one engine in this process

    work = tmp_path / "profile"
    gate = Gate(work / "gate")
    spec = {"mode": "profile", "policy": str(policy), "prompts": str(prompts), "runtime": PROFILE_RUNTIME}
    spec["profile"] = PROFILE | {"actors": "runtime"}
    # calls 1-2 run; 3-4 (one per actor) hold until release 1; 5 runs; 6.. hold until release 2
    proc, result_path = start_driver(cluster, work, "first", holds=[2, 5], **spec)
    wait_for(
        "both actors holding a minibatch", lambda: gate.count("calls") >= 4 and len(saved_chunks(work)) >= 2, proc
    )
    assert sorted(cluster.label_of(w["node"]) for w in where(work)) == ["gen_a", "gen_b"]  # one engine per node
    killed_a = cluster.kill("gen_a")
    log = work / "first.log"
    wait_for("the loss seen", lambda: "died (" in log.read_text(), proc)  # its minibatch queued for the survivor
    gate.tick("release")
    wait_for("the survivor holding again", lambda: gate.count("calls") >= 6, proc)
    cluster.kill("gen_b")
    gate.tick("release")
    code, first = finish(proc, result_path)
    assert code == 2 and "every profile minibatch actor died" in first["user_error"], first
    saved = saved_chunks(work)
    lost = set(first["sent"]) - saved  # sent, never saved: what was in flight when the nodes went
    retried = len(first["sent"]) - len(set(first["sent"]))
    assert len(saved) >= 4 and len(lost) <= 1 and retried == 1, (saved, first["sent"])  # gen_b's one in flight
    print(
        f"\n[multinode] profile: gen_a lost ({retried} minibatch re-sent to gen_b), then gen_b: {len(saved)} of 8 "
        f"chunks saved, {len(lost)} minibatch(es) lost in flight; run ended {first['ended'] - killed_a:.1f} s after "
        "the first loss"
    )

    # the rerun, here with one engine in this process (a chunk does not depend on the layout that made it)
    generated: list[int] = []
    real = profile.generate_minibatches

    def recorded(engine, todo, sampling, seed):
        generated.extend(m for m, _ in todo)
        return real(engine, todo, sampling, seed)

    monkeypatch.setattr(profile, "generate_minibatches", recorded)
    started = time.time()
    profile.run(
        validate_params(raw, "rerun"), rebase(profile.Paths(policy=policy, prompts=prompts), work), NullTracker()
    )
    assert sorted(generated) == sorted(set(range(8)) - saved)  # nothing a saved chunk holds is generated again
    for name in ("samples.parquet", "prompts.parquet"):  # the samples of one uninterrupted in-process engine
        assert (work / "outputs" / "profile" / name).read_bytes() == (reference.out_dir / name).read_bytes(), name
    print(f"[multinode] profile rerun generated {len(generated)} minibatches in {time.time() - started:.1f} s")
