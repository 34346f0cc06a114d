"""DVC stage `policy`: build and warm-start the demo policy, or record a local checkpoint path + hash.

Run: `asp stage policy` (dvc.yaml calls this). Reads params `common.seed`, `policy`; writes outputs/policy/
(policy.json, and model/ in the demo preset) and metrics/policy.json.
"""

from asp.pipeline import policy
from asp.stage import run_stage


def main() -> None:
    run_stage("policy", policy.run, policy.Paths())


if __name__ == "__main__":
    main()
