"""The multi-node test cluster's keeper process (tests/runtime/test_multinode.py): Ray's `cluster_utils.Cluster` with a
head node and labelled worker nodes on 127.0.0.1, driven by one JSON command per stdin line, one JSON reply per stdout
line. Its own process, because starting a Ray node points the starting process's Ray globals (the internal KV client)
at that cluster, and removing the cluster resets them: a pytest worker joined to the session's Ray must not do either.

    python tests/runtime/multinode_cluster.py NODES_JSON       # NODES_JSON: label -> ray node arguments
    {"op": "whole"}            -> {"address", "nodes": {label: node id}}  adds every missing labelled node
    {"op": "kill", "label": L} -> {"killed": time.time() when SIGKILLs were sent}
    {"op": "pids"}             -> {"pids": [...]}  the processes of every node (GCS, raylets, agents, ...)
    {"op": "shutdown"}         -> {} and exits

Run with RAY_TMPDIR set to a short private directory: Ray writes the cluster's address to
$RAY_TMPDIR/ray/ray_current_cluster, where no other `ray.init()` on the machine looks.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

SMALL = {"object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}  # 8 agents share 24 GiB
HEALTH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}  # dead after ~3 s (default ~15 s)


class Keeper:
    def __init__(self, labelled: dict[str, dict[str, Any]]) -> None:
        from ray.cluster_utils import Cluster

        head = {**SMALL, "num_cpus": 0, "include_dashboard": False, "_system_config": HEALTH}
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.labelled, self.nodes = labelled, {}

    def whole(self) -> dict[str, Any]:
        for label, args in self.labelled.items():
            if label not in self.nodes:
                self.nodes[label] = self.cluster.add_node(**SMALL, **args)
        self.cluster.wait_for_nodes()
        return {"address": self.cluster.address, "nodes": {label: n.node_id for label, n in self.nodes.items()}}

    def kill(self, label: str) -> dict[str, Any]:
        """Lose node `label` as when its machine goes down: SIGKILL its workers (the actors) and every process of the
        node (raylet, agents) at once. Ray's ``remove_node`` alone kills the raylet and agents but not the workers,
        which run on (and answer their callers directly) until they notice their raylet is gone."""
        import psutil

        node = self.nodes.pop(label)
        own = [psutil.Process(pid) for infos in node.all_processes.values() for pid in {i.process.pid for i in infos}]
        procs = [child for proc in own for child in proc.children(recursive=True)] + own
        killed = time.time()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
        self.cluster.remove_node(node, allow_graceful=False)
        return {"killed": killed}

    def pids(self) -> dict[str, Any]:
        nodes = self.cluster.list_all_nodes()
        return {"pids": sorted({i.process.pid for n in nodes for infos in n.all_processes.values() for i in infos})}


def main(labelled_json: str) -> int:
    keeper = Keeper(json.loads(labelled_json))
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "shutdown":
            keeper.cluster.shutdown()
            print("{}", flush=True)
            return 0
        reply = keeper.kill(command["label"]) if op == "kill" else getattr(keeper, op)()
        print(json.dumps(reply), flush=True)
    keeper.cluster.shutdown()  # stdin closed: the test process is gone
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
