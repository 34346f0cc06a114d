"""DVC stage `launch`: the asynchronous multi-instance RL run over the schedule (Ray; simulated trainer).

Run: `asp stage launch` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import launch
from asp.stage import run_stage


def main() -> None:
    run_stage("launch", launch.run, launch.Paths())


if __name__ == "__main__":
    main()
