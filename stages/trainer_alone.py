"""DVC stage `trainer_alone`: the GRPO trainer's step timed alone on this machine's cores, in the pipeline's sitting
(the full speed the simulate stage puts under the sharing probe's slowdowns).

Run: `asp stage trainer_alone` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import trainer_alone
from asp.stage import run_stage


def main() -> None:
    run_stage("trainer_alone", trainer_alone.run, trainer_alone.Paths())


if __name__ == "__main__":
    main()
