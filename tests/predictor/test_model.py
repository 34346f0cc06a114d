"""Backbone loading (errors, kind detection), pooling, truncation counting, both backbone kinds end to end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, T5Config

from asp.errors import UserError
from asp.predictor.model import (
    LengthPredictor,
    cls_pool,
    detect_kind,
    encode_texts,
    last_token_pool,
    load_backbone,
    mean_pool,
    pad_batch,
    pad_token_id,
    truncate_ids,
)

TEXTS = ["Add mod 10: a=3 b=7", "Add mod 10: a=1 b=2 c=3 d=4 e=5 f=6", "Add mod 10: a=9"]


def test_missing_dir_names_path(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"nowhere.*not a local directory.*download"):
        load_backbone(tmp_path / "nowhere", max_length=32, kind="auto", dtype="float32")


def test_hub_id_is_not_downloaded() -> None:
    with pytest.raises(UserError, match="Qwen/Qwen2.5-1.5B is not a local directory"):
        load_backbone("Qwen/Qwen2.5-1.5B", max_length=32, kind="auto", dtype="float32")


def test_missing_config_and_tokenizer(tmp_path: Path, tiny_qwen2_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty has no config \(looked for config.json\)"):
        load_backbone(tmp_path / "empty", max_length=32, kind="auto", dtype="float32")
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(tiny_qwen2_path / f, no_tok / f)
    with pytest.raises(UserError, match=r"no_tok has no tokenizer \(looked for tokenizer.json"):
        load_backbone(no_tok, max_length=32, kind="auto", dtype="float32")
    (no_tok / "model.safetensors").unlink()
    with pytest.raises(UserError, match="no weights"):
        load_backbone(no_tok, max_length=32, kind="auto", dtype="float32")


def test_bad_kind_and_max_length(minilm_path: Path) -> None:
    with pytest.raises(UserError, match="kind must be"):
        load_backbone(minilm_path, kind="seq2seq", max_length=32, dtype="float32")
    with pytest.raises(UserError, match=r"max_length=1000 is outside \[2, 512\]"):
        load_backbone(minilm_path, max_length=1000, kind="auto", dtype="float32")


def test_detect_kind(minilm_path: Path, tiny_qwen2_path: Path) -> None:
    assert load_backbone(minilm_path, max_length=32, kind="auto", dtype="float32").kind == "encoder"
    assert load_backbone(tiny_qwen2_path, max_length=32, kind="auto", dtype="float32").kind == "decoder"
    assert detect_kind(Qwen2Config()) == "decoder"  # no architectures: decided by model type
    with pytest.raises(UserError, match="encoder-decoder"):
        detect_kind(T5Config())


def test_mean_and_last_token_pool() -> None:
    hidden = torch.tensor([[[1.0], [3.0], [100.0]], [[7.0], [5.0], [2.0]]])  # [2, 3, 1]
    right = torch.tensor([[1, 1, 0], [1, 1, 1]])
    left = torch.tensor([[0, 1, 1], [1, 1, 1]])
    # mean over unmasked: row 0 (1 + 3) / 2 = 2, row 1 (7 + 5 + 2) / 3 = 14/3
    torch.testing.assert_close(mean_pool(hidden, right), torch.tensor([[2.0], [14 / 3]]))
    # last unmasked position: right padding -> index 1 (3.0); left padding -> index 2 (100.0); full row -> 2.0
    torch.testing.assert_close(last_token_pool(hidden, right), torch.tensor([[3.0], [2.0]]))
    torch.testing.assert_close(last_token_pool(hidden, left), torch.tensor([[100.0], [2.0]]))


def test_pad_batch_sides() -> None:
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=0, side="left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=9, side="right")
    assert ids.tolist() == [[5, 6, 7], [8, 9, 9]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_truncation_is_counted(minilm_path: Path) -> None:
    bb = load_backbone(minilm_path, max_length=8, kind="auto", dtype="float32")
    enc = encode_texts(bb.tokenizer, ["short", "Add mod 10: a=1 b=2 c=3 d=4 e=5", "x " * 600], max_length=8)
    assert enc.truncated == [False, True, True] and enc.n_truncated == 2
    assert [len(s) for s in enc.input_ids] == [3, 8, 8]  # [CLS] short [SEP]; cut ones keep [SEP] at the end
    assert enc.input_ids[1][-1] == bb.tokenizer.sep_token_id


def _random_lora(model: LengthPredictor) -> None:
    """LoRA B starts at zero; make it non-zero so the adapters matter in the checks below."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)


@pytest.mark.parametrize("side", ["left", "right"])
def test_decoder_padding_side_does_not_change_predictions(tiny_qwen2_path: Path, side: str) -> None:
    bb = load_backbone(tiny_qwen2_path, max_length=64, kind="auto", dtype="float32")
    model = LengthPredictor(
        bb, lora_r=4, lora_alpha=8, seed=0, head="linear", pooling="auto", truncation_side="right"
    ).eval()
    _random_lora(model)
    enc = encode_texts(bb.tokenizer, TEXTS, 64)
    with torch.no_grad():
        batched = model(*pad_batch(enc.input_ids, pad_token_id(bb.tokenizer), side))
        single = torch.cat([model(*pad_batch([s], 0)) for s in enc.input_ids])
    assert batched.shape == (3,)
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)
    assert model.spec.pooling == "last" and model.spec.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")


def test_encoder_batched_equals_single(minilm_path: Path) -> None:
    bb = load_backbone(minilm_path, max_length=64, kind="auto", dtype="float32")
    model = LengthPredictor(bb, seed=0, head="linear", pooling="auto", truncation_side="right").eval()
    _random_lora(model)
    enc = encode_texts(bb.tokenizer, TEXTS, 64)
    with torch.no_grad():
        batched = model(*pad_batch(enc.input_ids, pad_token_id(bb.tokenizer)))
        single = torch.cat([model(*pad_batch([s], 0)) for s in enc.input_ids])
    torch.testing.assert_close(batched, single, atol=1e-4, rtol=1e-4)
    assert model.spec.pooling == "mean"
    # only LoRA and head train: 6 layers x 3 modules x r(384 + 384) = 110,592 LoRA + 385 head parameters
    assert sum(p.numel() for p in model.trainable_parameters()) == 110_592 + 385


def test_seed_makes_init_reproducible(tiny_qwen2_path: Path) -> None:
    a = LengthPredictor(
        load_backbone(tiny_qwen2_path, max_length=32, kind="auto", dtype="float32"),
        head="mlp",
        seed=3,
        pooling="auto",
        truncation_side="right",
    )
    b = LengthPredictor(
        load_backbone(tiny_qwen2_path, max_length=32, kind="auto", dtype="float32"),
        head="mlp",
        seed=3,
        pooling="auto",
        truncation_side="right",
    )
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb)


def test_bad_target_modules(tiny_qwen2_path: Path) -> None:
    with pytest.raises(UserError, match="target_modules"):
        LengthPredictor(
            load_backbone(tiny_qwen2_path, max_length=32, kind="auto", dtype="float32"),
            target_modules=["no_such_layer"],
            head="linear",
            pooling="auto",
            truncation_side="right",
        )


def test_truncate_ids_sides_keep_special_tokens() -> None:
    ids, special = [101, 1, 2, 3, 4, 5, 6, 102], [1, 0, 0, 0, 0, 0, 0, 1]  # [CLS] six tokens [SEP]
    assert truncate_ids(ids, special, 5, "right") == [101, 1, 2, 3, 102]
    assert truncate_ids(ids, special, 5, "left") == [101, 4, 5, 6, 102]
    assert truncate_ids(ids, special, 6, "middle") == [101, 1, 2, 5, 6, 102]  # head 2, tail 2
    assert truncate_ids(ids, special, 5, "middle") == [101, 1, 2, 6, 102]  # odd: the head gets the extra token
    assert truncate_ids(ids, special, 8, "middle") == ids  # short enough: unchanged
    assert truncate_ids([7, 8, 9, 10], [0, 0, 0, 0], 2, "left") == [9, 10]  # no special tokens (a decoder)
    with pytest.raises(ValueError, match="truncation side"):
        truncate_ids(ids, special, 5, "top")


def test_encode_texts_cuts_the_chosen_side(minilm_path: Path) -> None:
    tok = load_backbone(minilm_path, max_length=8, kind="auto", dtype="float32").tokenizer
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    full = tok(text)["input_ids"]
    right, left, middle = (encode_texts(tok, [text], 8, side).input_ids[0] for side in ("right", "left", "middle"))
    assert right == full[:7] + full[-1:] and left == full[:1] + full[-7:]
    assert middle == full[:4] + full[-4:] and all(len(x) == 8 for x in (right, left, middle))


def test_cls_pool_takes_the_first_real_token() -> None:
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])  # right padded, left padded
    assert cls_pool(hidden, mask).tolist() == [[0.0, 1.0], [8.0, 9.0]]


def test_pooling_choice_and_full_fine_tuning(minilm_path: Path) -> None:
    enc = encode_texts(load_backbone(minilm_path, max_length=32, kind="auto", dtype="float32").tokenizer, TEXTS, 32)
    ids, mask = pad_batch(enc.input_ids, 0)
    full = LengthPredictor(
        load_backbone(minilm_path, max_length=32, kind="auto", dtype="float32"),
        lora_r=0,
        pooling="cls",
        seed=0,
        head="linear",
        truncation_side="right",
    ).eval()
    assert full.spec.pooling == "cls" and full.spec.lora_r == 0
    n_backbone = sum(p.numel() for p in full.backbone.parameters())
    assert sum(p.numel() for p in full.trainable_parameters()) == n_backbone + 385  # every weight + the head
    with torch.no_grad():  # cls pooling = the head on the [CLS] state
        cls = full.backbone(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        torch.testing.assert_close(full(ids, mask), full.head(cls).squeeze(-1))
    with pytest.raises(UserError, match="pooling"):
        LengthPredictor(
            load_backbone(minilm_path, max_length=32, kind="auto", dtype="float32"),
            pooling="max",
            head="linear",
            truncation_side="right",
        )
    with pytest.raises(UserError, match="truncation_side"):
        LengthPredictor(
            load_backbone(minilm_path, max_length=32, kind="auto", dtype="float32"),
            truncation_side="top",
            head="linear",
            pooling="auto",
        )


def test_reprofile_fine_tunes_a_fully_fine_tuned_predictor_whole(minilm_path: Path) -> None:
    """A re-profile continues training the loaded predictor as it was trained: with `predictor.lora.r: 0` (loaded
    frozen, like saved adapters) every backbone weight trains again, not only the head."""
    import numpy as np

    from asp.adaptation.reprofile import fine_tune
    from asp.config import Params, deep_merge, validate_params

    overlay = {"predictor": {"lora": {"r": 0}, "batch_size": 2, "max_length": 32}, "drift": {"reprofile_epochs": 1}}
    params = validate_params(deep_merge(Params.defaults().model_dump(mode="json"), overlay), "test params")
    backbone = load_backbone(minilm_path, max_length=32, kind="auto", dtype="float32")
    model = LengthPredictor(backbone, lora_r=0, seed=0, head="linear", pooling="auto", truncation_side="right")
    model.backbone.requires_grad_(False)  # as loaded from a checkpoint
    before = {n: p.detach().clone() for n, p in model.backbone.named_parameters()}
    texts = [*TEXTS, "Add mod 10: a=2 b=2 c=2", "Add mod 10: a=5 b=1 c=1 d=1", "Add mod 10: a=4 b=4"]
    roles = np.array(["train", "train", "train", "train", "val", "val"])
    fine_tune(model, backbone.tokenizer, texts, np.array([8.0, 30.0, 4.0, 14.0, 20.0, 10.0]), roles, params, seed=0)
    assert all(p.requires_grad for p in model.backbone.parameters())
    after = dict(model.backbone.named_parameters())
    assert any(not torch.equal(before[n], after[n].detach()) for n in before)  # the backbone itself moved
