"""docs/integrations.md's verl dataset class against verl 0.9.1's real `RLHFDataset`: loaded through
`get_dataset_class` (``data.custom_cls``), walked by the `SequentialSampler` that verl's `create_rl_sampler`
returns for ``data.shuffle=False``, it yields the prompts in the schedule's dispatch order.

verl cannot be installed beside asp's pins (it needs transformers < 5.11), so this test skips unless verl's package
is importable; to run it, unpack ``verl==0.9.1``, ``tensordict==0.10.0``, ``torchdata==0.11.0`` and ``pyvers``
(``pip download --no-deps``) into a folder and put it on PYTHONPATH."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

rl_dataset = pytest.importorskip("verl.utils.dataset.rl_dataset")

from omegaconf import OmegaConf  # noqa: E402
from torch.utils.data import SequentialSampler  # noqa: E402

from asp.demo.task import generate_problems  # noqa: E402
from asp.demo.tokenizer import build_tokenizer  # noqa: E402
from asp.schedule import build_schedule, schedule_to_frame  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def docs_class_source() -> str:
    """The ``my_project/asp_dataset.py`` block of docs/integrations.md, as written there."""
    text = DOCS.read_text()
    start = text.index("# my_project/asp_dataset.py")
    return text[start : text.index("```", start)]


def test_docs_class_walks_verl_in_dispatch_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import verl

    monkeypatch.chdir(tmp_path)
    ids = [f"p{i:02d}" for i in range(12)]
    problems = [r["problem"] for r in generate_problems(12, seed=1)]
    chats = [[{"role": "user", "content": p}] for p in problems]
    pd.DataFrame({"prompt": chats, "prompt_id": ids}).to_parquet(tmp_path / "train.parquet")
    schedule = build_schedule(
        np.array(ids), np.linspace(90.0, 5.0, 12), b=3, kappa=0, k=2, iterations=0, seed=0, method="asp"
    )
    (tmp_path / "outputs/schedule").mkdir(parents=True)
    schedule_to_frame(schedule).to_parquet(tmp_path / "outputs/schedule/schedule.parquet")
    (tmp_path / "asp_dataset.py").write_text(docs_class_source())
    base = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/data/legacy_data.yaml")
    custom = {"path": str(tmp_path / "asp_dataset.py"), "name": "AspOrderedDataset"}
    config = OmegaConf.merge(base, {"shuffle": False, "custom_cls": custom, "filter_overlong_prompts": False})
    cls = rl_dataset.get_dataset_class(config)
    dataset = cls(data_files=[str(tmp_path / "train.parquet")], tokenizer=build_tokenizer(), config=config)
    walked = [dataset.dataframe[i]["prompt_id"] for i in SequentialSampler(dataset)]
    assert walked == schedule.prompt_ids.tolist() != ids
