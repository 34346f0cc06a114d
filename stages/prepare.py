"""DVC stage `prepare`: load, check, template and split the prompts.

Run: `asp stage prepare` (dvc.yaml calls this). Reads params `common.seed`, `prepare`, `profile.max_new_tokens`
and `runtime.sampling.max_new_tokens` (room left for responses in the policy's context); writes
outputs/prompts/{train,profile,heldout}.parquet and metrics/prepare.json.
"""

from asp.pipeline import prepare
from asp.stage import run_stage


def main() -> None:
    run_stage("prepare", prepare.run, prepare.Paths())


if __name__ == "__main__":
    main()
