"""DVC stage `simulate`: the launch run predicted on a simulated clock (C0-C4 side by side), from fitted time
and length models, without generating anything.

Run: `asp stage simulate` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import simulate
from asp.stage import run_stage


def main() -> None:
    run_stage("simulate", simulate.run, simulate.Paths())


if __name__ == "__main__":
    main()
