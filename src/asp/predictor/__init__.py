"""Length predictor (paper §3.2, appendix F.4): predict log(1 + mean response length) of a prompt.

Modules (import them directly; this package imports nothing, so light users such as the scheduler do not pay
for torch/transformers when they only need the calibration map):

* ``model``       - ``load_backbone`` (local paths only), ``LengthPredictor`` (LoRA + pooling + head), tokenization
* ``losses``      - MSE on log1p targets, RankNet pairwise and ListNet listwise ranking losses
* ``metrics``     - Kendall tau, Spearman, MAE, pairwise accuracy, per-bucket errors
* ``calibration`` - monotone isotonic map from predicted to expected true length
* ``train``       - ``train_predictor`` (early stopping on validation tau) and ``predict_lengths``

Saving and loading a trained predictor is I/O and lives outside the pure core, in ``asp.steps.checkpoint``.

Tests: ``.venv/bin/python -m pytest tests/predictor -q``; benchmark on demo-like prompts:
``.venv/bin/python benchmarks/bench_predictor.py``.
"""
