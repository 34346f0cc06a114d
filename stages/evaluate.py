"""DVC stage `evaluate`: held-out Kendall tau / Spearman / MAE, calibration map, tau gate.

Run: `asp stage evaluate` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import evaluate
from asp.stage import run_stage


def main() -> None:
    run_stage("evaluate", evaluate.run, evaluate.Paths())


if __name__ == "__main__":
    main()
