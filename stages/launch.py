"""DVC stage `launch`: the asynchronous multi-instance RL run over the schedule (Ray; GRPO or simulated trainer).

An interrupted run resumes from outputs/launch_state/ in the same MLflow run.
Run: `asp stage launch` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import launch
from asp.stage import run_stage


def main() -> None:
    run_stage("launch", launch.run, launch.Paths(), resume_run=launch.resume_run_id)


if __name__ == "__main__":
    main()
