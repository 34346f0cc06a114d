"""DVC stage `predict`: predict (and calibrate) the response length of every training prompt.

Run: `asp stage predict` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import predict
from asp.stage import run_stage


def main() -> None:
    run_stage("predict", predict.run, predict.Paths())


if __name__ == "__main__":
    main()
