"""DVC stage `sim_check`: the simulate stage's prediction against the launch it predicted (the error per metric,
on every pipeline run that runs a launch).

Run: `asp stage sim_check` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import sim_check
from asp.stage import run_stage


def main() -> None:
    run_stage("sim_check", sim_check.run, sim_check.Paths())


if __name__ == "__main__":
    main()
