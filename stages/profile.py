"""DVC stage `profile`: roll out the policy on the profiling + held-out prompts, measure response lengths.

A killed run resumes from its saved chunks in the same MLflow run.
Run: `asp stage profile` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import profile
from asp.stage import run_stage


def main() -> None:
    run_stage("profile", profile.run, profile.Paths(), resume_run=profile.resume_run_id)


if __name__ == "__main__":
    main()
