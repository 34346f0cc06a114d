"""DVC stage `profile`: roll out the policy on the profiling + held-out prompts, measure response lengths.

Run: `asp stage profile` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import profile
from asp.stage import run_stage


def main() -> None:
    run_stage("profile", profile.run, profile.Paths())


if __name__ == "__main__":
    main()
