"""Turn (prompt ids, response ids, behaviour log-probs) into padded training tensors, and plan micro-batches.

A sequence is ``prompt + response``, right-padded. Logits at position t predict token t + 1, so the
response tokens of a row whose prompt has P tokens are scored at logit positions P - 1 ... P + R - 2;
every per-token tensor here lives on that (R, L - 1) "target" grid, with a mask of 1.0 on response tokens.

`plan_micro_batches` packs rows, sorted by length, into micro-batches whose padded size
(rows x longest row) stays within a token budget, so memory is bounded independently of the global batch.

Run the tests with ``python -m pytest tests/rl -q``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class PackedRows:
    """Padded tensors of R rows (L = longest prompt + response).

    Attributes:
        input_ids: (R, L) int64, right-padded with `pad_id`.
        attention_mask: (R, L) int64.
        targets: (R, L - 1) int64, ``input_ids[:, 1:]``.
        mask: (R, L - 1) float32, 1.0 where the target is a response token.
        behaviour: (R, L - 1) float32 behaviour log-probs on response targets (0 elsewhere).
        advantages: (R,) float32.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    behaviour: torch.Tensor
    advantages: torch.Tensor


def pack_rows(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[np.ndarray],
    behaviour: Sequence[np.ndarray],
    advantages: np.ndarray,
    pad_id: int,
) -> PackedRows:
    """Pad rows of ``prompt + response`` and lay response-aligned values on the target grid.

    Args:
        prompts: R prompt token-id lists (each >= 1 token).
        responses: R response token-id arrays (may be empty).
        behaviour: R behaviour log-prob arrays, each as long as its response.
        advantages: (R,) per-row advantages.
        pad_id: padding token id.

    Raises:
        ValueError: an empty prompt or a log-prob array whose length differs from its response.

    Example: prompt [5, 6], response [7, 8]: input [5, 6, 7, 8], targets [6, 7, 8], mask [0, 1, 1].
    """
    rows = len(prompts)
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attn = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width - 1), dtype=torch.float32)
    beh = torch.zeros((rows, width - 1), dtype=torch.float32)
    for i, (p, r, b) in enumerate(zip(prompts, responses, behaviour, strict=True)):
        if len(p) < 1:
            raise ValueError(f"row {i}: empty prompt (the first response token needs a position to be scored at)")
        if len(b) != len(r):
            raise ValueError(f"row {i}: {len(b)} behaviour log-probs for {len(r)} response tokens")
        n_p, n_r = len(p), len(r)
        ids[i, :n_p] = torch.as_tensor(list(p), dtype=torch.long)
        if n_r:
            ids[i, n_p : n_p + n_r] = torch.tensor(np.asarray(r), dtype=torch.long)  # copies (inputs may be read-only)
            mask[i, n_p - 1 : n_p - 1 + n_r] = 1.0
            beh[i, n_p - 1 : n_p - 1 + n_r] = torch.tensor(np.asarray(b), dtype=torch.float32)
        attn[i, : n_p + n_r] = 1
    return PackedRows(
        input_ids=ids,
        attention_mask=attn,
        targets=ids[:, 1:].clone(),
        mask=mask,
        behaviour=beh,
        advantages=torch.as_tensor(np.asarray(advantages, dtype=np.float32)),
    )


def plan_micro_batches(row_lengths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Group row indices into micro-batches of at most `max_tokens` padded tokens (rows x longest row).

    Rows are sorted by length (longest first) so rows of similar length share a micro-batch; a row longer
    than the budget gets a micro-batch of its own.

    Args:
        row_lengths: (R,) prompt + response lengths in tokens.
        max_tokens: padded-token budget per micro-batch (>= 1).

    Returns:
        Index arrays covering every row exactly once.

    Example: lengths [4, 10, 3, 9] with budget 20: sorted 10, 9, 4, 3 -> [1, 3] (2 x 10 = 20), [0, 2] (2 x 4).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    lengths = np.asarray(row_lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    current: list[int] = []
    for idx in order.tolist():
        width = int(lengths[current[0]]) if current else int(lengths[idx])  # first row is the longest
        if current and (len(current) + 1) * width > max_tokens:
            batches.append(np.asarray(current, dtype=np.int64))
            current = []
        current.append(idx)
    if current:
        batches.append(np.asarray(current, dtype=np.int64))
    return batches
