"""Node loss on a multi-node Ray cluster on this machine: prompts lost / duplicated and time to recover (issue 23 §2).

Runs the slow multi-node tests (tests/runtime/test_multinode.py: a head + 3 worker raylets on 127.0.0.1, launch's
runtime and the 2-actor profile joined through runtime.ray.address, nodes SIGKILLed while known work is in flight)
and collects what they measure, each line printed by the test from its own assertions and timestamps:

* launch: seconds from losing a rollout node to its minibatches being re-issued to the surviving Generation Unit, to
  the next minibatch delivered and the next step trained; seconds from losing the last rollout node (and, in the next
  run, the train node) to the run stopping at its checkpoint; the final rerun's wall time; prompts lost / duplicated
  from the trainer ledger (asserted 0 / 0 by the test);
* profile: minibatches re-sent, chunks saved and minibatches lost in flight when both rollout nodes go; the rerun's
  minibatches.

The GCS declares a node dead after 3 missed health checks 1 s apart in these tests (Ray's default: 5 x 3 s, so
detection takes ~15 s longer on a default cluster whose raylet dies without its workers noticing). Times include the
machine's load: say so next to them.

    python benchmarks/node_loss.py [--out benchmarks/results/node_loss.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "node_loss.json")
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "pytest", "tests/runtime/test_multinode.py", "-s", "-q", "-p", "no:randomly"]
    started, load_before = time.time(), os.getloadavg()[0]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [line.removeprefix("[multinode] ") for line in proc.stdout.splitlines() if "[multinode]" in line]
    lines = [line.strip() for line in lines]
    for line in lines:
        print(line)
    result = {"command": "python " + " ".join(cmd[1:]), "exit_code": proc.returncode}
    result |= {"wall_s": round(time.time() - started, 1), "load_average_1min": [load_before, os.getloadavg()[0]]}
    result["measured"] = lines
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"tests exit {proc.returncode} in {result['wall_s']} s (load {result['load_average_1min']}); {args.out}")
    if proc.returncode:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
