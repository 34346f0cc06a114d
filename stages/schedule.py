"""DVC stage `schedule`: DP minibatches + balanced batch groups from the predictions; C0-C4 ablation.

Run: `asp stage schedule` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import schedule
from asp.stage import run_stage


def main() -> None:
    run_stage("schedule", schedule.run, schedule.Paths())


if __name__ == "__main__":
    main()
