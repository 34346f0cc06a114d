"""Save/load round trip gives identical predictions; missing or corrupt files give UserError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from asp.errors import UserError
from asp.predictor.model import LengthPredictor, load_backbone
from asp.predictor.train import predict_lengths
from asp.steps.checkpoint import load_predictor, save_predictor

TEXTS = ["Add mod 10: a=3 b=7", "Add mod 10: a=1 b=2 c=3 d=4 e=5 f=6", "Add mod 10: a=9", "add 1 + 2 + 3"]


def _trained_like(path: Path, head: str, **kw: str) -> LengthPredictor:
    bb = load_backbone(path, max_length=48, kind="auto", dtype="float32")
    model = LengthPredictor(
        bb, lora_r=4, lora_alpha=8, head=head, seed=1, **{"pooling": "auto", "truncation_side": "right", **kw}
    )
    with torch.no_grad():  # non-zero LoRA B and a bias near log(1 + 30), as after training
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    model.set_output_bias(3.4)
    return model.eval()


@pytest.mark.parametrize(
    "which,head,options",
    [
        ("tiny_qwen2_path", "mlp", {}),
        ("minilm_path", "linear", {}),
        ("minilm_path", "linear", {"pooling": "cls", "truncation_side": "middle"}),
    ],
)
def test_round_trip_identical_predictions(which: str, head: str, options: dict, tmp_path: Path, request) -> None:
    model = _trained_like(request.getfixturevalue(which), head, **options)
    tok = load_backbone(request.getfixturevalue(which), max_length=48, kind="auto", dtype="float32").tokenizer
    before = predict_lengths(model, tok, TEXTS, batch_size=2)
    out = save_predictor(model, tok, tmp_path / "pred", {"kendall_tau": 0.7, "n_train": 4})
    info = json.loads((out / "predictor.json").read_text())
    assert info["max_length"] == 48 and info["head"] == head and info["target_transform"] == "log1p_mean_length"
    assert (out / "adapter" / "adapter_model.safetensors").is_file() and (out / "head.safetensors").is_file()
    assert not list(out.glob("**/model.safetensors"))  # backbone weights are referenced, not copied
    loaded, tok2, meta = load_predictor(out, dtype="float32")
    assert meta == {"kendall_tau": 0.7, "n_train": 4}
    assert loaded.spec == model.spec  # pooling and truncation side included
    after = predict_lengths(loaded, tok2, TEXTS, batch_size=2)
    np.testing.assert_array_equal(before, after)
    assert np.all(before > 0) and len(set(before.round(6))) > 1  # non-trivial predictions


@pytest.mark.parametrize("side", ["left", "middle"])
def test_the_predict_stage_truncates_long_prompts_on_the_side_the_predictor_was_trained_with(
    side: str, minilm_path: Path
) -> None:
    """`predict` (and its sharded actors, same call) cut a long prompt where training and `evaluate` cut it."""
    from asp.pipeline.predict import predict_all

    model = _trained_like(minilm_path, "linear", truncation_side=side)
    tok = load_backbone(minilm_path, max_length=48, kind="auto", dtype="float32").tokenizer
    long = ["Add mod 10: " + " ".join(f"a{i}={i % 10}" for i in range(60)) + f" then answer {k}" for k in range(3)]
    texts = TEXTS + long  # the three long ones differ only at their end, which right-truncation would cut
    predicted, n_truncated = predict_all(model, tok, texts, batch_size=3)
    assert n_truncated == 3
    np.testing.assert_allclose(predicted, predict_lengths(model, tok, texts, batch_size=3), rtol=1e-5)
    if side == "left":  # the kept ends differ, so do the predictions (right-truncation made them equal)
        assert len(set(predicted[-3:].round(6))) == 3


def test_save_is_atomic_and_replaces(tiny_qwen2_path: Path, tmp_path: Path) -> None:
    model = _trained_like(tiny_qwen2_path, "linear")
    tok = load_backbone(tiny_qwen2_path, max_length=48, kind="auto", dtype="float32").tokenizer
    save_predictor(model, tok, tmp_path / "pred", {"v": 1})
    with pytest.raises(ValueError, match="JSON-serialisable"):
        save_predictor(model, tok, tmp_path / "pred", {"v": object()})
    save_predictor(model, tok, tmp_path / "pred", {"v": 2})
    assert load_predictor(tmp_path / "pred", dtype="float32")[2] == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["pred"]  # no temporary leftovers


def test_load_errors(tiny_qwen2_path: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_predictor(tmp_path / "missing", dtype="float32")
    model = _trained_like(tiny_qwen2_path, "linear")
    tok = load_backbone(tiny_qwen2_path, max_length=48, kind="auto", dtype="float32").tokenizer
    good = save_predictor(model, tok, tmp_path / "good", {})

    def broken(name: str) -> Path:
        d = tmp_path / name
        shutil.copytree(good, d)
        return d

    d = broken("nojson")
    (d / "predictor.json").unlink()
    with pytest.raises(UserError, match=r"nojson/predictor.json is missing"):
        load_predictor(d, dtype="float32")
    d = broken("badjson")
    (d / "predictor.json").write_text("{not json")
    with pytest.raises(UserError, match=r"badjson/predictor.json is corrupt"):
        load_predictor(d, dtype="float32")
    d = broken("nohead")
    (d / "head.safetensors").unlink()
    with pytest.raises(UserError, match=r"nohead/head.safetensors is missing"):
        load_predictor(d, dtype="float32")
    d = broken("badhead")
    (d / "head.safetensors").write_bytes(b"garbage")
    with pytest.raises(UserError, match="badhead could not be loaded"):
        load_predictor(d, dtype="float32")
    d = broken("badadapter")
    (d / "adapter" / "adapter_model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(UserError, match="badadapter could not be loaded"):
        load_predictor(d, dtype="float32")
    d = broken("moved")
    info = json.loads((d / "predictor.json").read_text())
    info["backbone_path"] = str(tmp_path / "gone")
    (d / "predictor.json").write_text(json.dumps(info))
    with pytest.raises(UserError, match="gone is not a local directory"):
        load_predictor(d, dtype="float32")
    load_predictor(d, backbone_path=tiny_qwen2_path, dtype="float32")  # the override fixes a moved backbone


def test_wrong_backbone_is_named(tiny_qwen2_path: Path, minilm_path: Path, tmp_path: Path) -> None:
    model = _trained_like(tiny_qwen2_path, "linear")
    tok = load_backbone(tiny_qwen2_path, max_length=48, kind="auto", dtype="float32").tokenizer
    d = save_predictor(model, tok, tmp_path / "pred", {})
    with pytest.raises(UserError, match="hidden size 384 but the predictor"):
        load_predictor(d, backbone_path=minilm_path, dtype="float32")


def test_round_trip_full_fine_tuning_with_lexical_ridge(minilm_path: Path, tmp_path: Path) -> None:
    from asp.predictor.lexical import fit_lexical
    from asp.predictor.model import encode_texts

    bb = load_backbone(minilm_path, max_length=48, kind="auto", dtype="float32")
    model = LengthPredictor(
        bb, lora_r=0, lexical_weight=0.5, seed=1, head="linear", pooling="auto", truncation_side="right"
    )
    with torch.no_grad():  # a changed backbone weight, as after full fine-tuning
        model.backbone.encoder.layer[0].attention.self.query.weight.mul_(1.5)
    model.set_output_bias(3.4)
    model.lexical = fit_lexical(encode_texts(bb.tokenizer, TEXTS, 48).input_ids, np.log1p([10.0, 80.0, 5.0, 30.0]))
    model.eval()
    before = predict_lengths(model, bb.tokenizer, TEXTS, batch_size=2)
    out = save_predictor(model, bb.tokenizer, tmp_path / "pred", {})
    assert (out / "backbone.safetensors").is_file() and (out / "lexical.safetensors").is_file()
    assert not (out / "adapter").exists()
    loaded, tok2, _ = load_predictor(out, dtype="float32")
    assert loaded.spec == model.spec and loaded.spec.lexical_weight == 0.5
    np.testing.assert_array_equal(predict_lengths(loaded, tok2, TEXTS, batch_size=2), before)
    (out / "lexical.safetensors").unlink()
    with pytest.raises(UserError, match="lexical.safetensors is missing"):
        load_predictor(out, dtype="float32")
