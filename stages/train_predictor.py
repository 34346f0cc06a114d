"""DVC stage `train_predictor`: fine-tune the LoRA length predictor on profiled mean lengths.

Run: `asp stage train_predictor` (dvc.yaml calls this; its deps, params and outs are listed there).
"""

from asp.pipeline import train_predictor
from asp.stage import run_stage


def main() -> None:
    run_stage("train_predictor", train_predictor.run, train_predictor.Paths())


if __name__ == "__main__":
    main()
