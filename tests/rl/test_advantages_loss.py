"""GRPO advantages, clipped loss, KL and aggregation on hand-worked cases; gradient accumulation is exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asp.rl import (
    aggregate,
    clipped_policy_loss,
    group_advantages,
    grpo_loss,
    kl_k3,
    loss_denominator,
    token_logprobs,
    zero_signal_groups,
)
from asp.rl.lr import lr_factor


def test_group_advantages_by_hand():
    # [1, 0, 0, 1]: mean 0.5, unbiased std = sqrt((4 * 0.25) / 3) = 0.57735 -> +-0.5 / 0.57735 = +-0.8660
    a = group_advantages(np.array([1.0, 0.0, 0.0, 1.0]), n=4)
    np.testing.assert_allclose(a, [0.8660, -0.8660, -0.8660, 0.8660], atol=1e-4)
    # two prompts, n = 2: [3, 1] -> mean 2, std sqrt(2) -> +-1/sqrt(2); [5, 5] -> equal rewards -> 0
    b = group_advantages(np.array([3.0, 1.0, 5.0, 5.0]), n=2)
    np.testing.assert_allclose(b, [1 / math.sqrt(2), -1 / math.sqrt(2), 0.0, 0.0], atol=1e-5)
    # scale="none" (Dr. GRPO): centred only -> [0.5, -0.5, -0.5, 0.5]
    np.testing.assert_allclose(group_advantages(np.array([1.0, 0, 0, 1]), 4, scale="none"), [0.5, -0.5, -0.5, 0.5])
    assert zero_signal_groups(np.array([3.0, 1.0, 5.0, 5.0]), 2) == 1
    assert group_advantages(np.array([1.0, 0.0]), n=1).tolist() == [0.0, 0.0]  # a group of one: no baseline
    with pytest.raises(ValueError, match="multiple of n"):
        group_advantages(np.zeros(5), n=2)
    with pytest.raises(ValueError, match="finite"):
        group_advantages(np.array([np.nan, 1.0]), n=2)


def test_clipped_policy_loss_by_hand():
    # ratios 1.5, 1.5, 0.5, 0.5 with advantages +1, -1, +1, -1 and clip 0.2 (range [0.8, 1.2]):
    #   1.5 * +1 vs 1.2 * +1 -> min 1.2  -> loss -1.2 (clipped: no gradient)
    #   1.5 * -1 vs 1.2 * -1 -> min -1.5 -> loss  1.5 (unclipped)
    #   0.5 * +1 vs 0.8 * +1 -> min 0.5  -> loss -0.5 (unclipped)
    #   0.5 * -1 vs 0.8 * -1 -> min -0.8 -> loss  0.8 (clipped)
    logp = torch.log(torch.tensor([[1.5], [1.5], [0.5], [0.5]])).requires_grad_()
    loss, ratio, clipped = clipped_policy_loss(logp, torch.zeros(4, 1), torch.tensor([1.0, -1.0, 1.0, -1.0]), 0.2, 0.2)
    np.testing.assert_allclose(loss.detach().squeeze().numpy(), [-1.2, 1.5, -0.5, 0.8], atol=1e-6)
    assert clipped.squeeze().tolist() == [True, False, False, True]
    loss.sum().backward()
    # d(-ratio * A)/d logp = -ratio * A on unclipped tokens: 1.5 and -0.5; clipped tokens get 0
    np.testing.assert_allclose(logp.grad.squeeze().numpy(), [0.0, 1.5, -0.5, 0.0], atol=1e-6)
    # clip-higher: clip_high 0.6 lets ratio 1.5 through for A = +1 -> loss -1.5
    ratio_15 = torch.log(torch.tensor([[1.5]]))
    high, _, _ = clipped_policy_loss(ratio_15, torch.zeros(1, 1), torch.tensor([1.0]), 0.2, 0.6)
    assert float(high) == pytest.approx(-1.5)


def test_kl_k3_by_hand():
    # logp = log 0.5, ref = log 0.25: d = ref - logp = log 0.5 -> exp(d) - d - 1 = 0.5 + 0.6931 - 1 = 0.1931
    value = kl_k3(torch.tensor(math.log(0.5)), torch.tensor(math.log(0.25)))
    assert float(value) == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
    assert float(kl_k3(torch.tensor(-1.0), torch.tensor(-1.0))) == 0.0


def test_aggregation_and_denominators_by_hand():
    # rows [1, 3] (2 tokens) and [5] (1 token): token = 9 / 3 = 3.0; sequence = (2 + 5) / 2 = 3.5
    values = torch.tensor([[1.0, 3.0], [5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    lengths = np.array([2, 1])
    assert float(aggregate(values, mask, "token", loss_denominator(lengths, "token"))) == pytest.approx(3.0)
    assert float(aggregate(values, mask, "sequence", loss_denominator(lengths, "sequence"))) == pytest.approx(3.5)
    three = np.array([3, 1, 0])  # token: 4 tokens; sequence: 2 samples with >= 1 token
    assert loss_denominator(three, "token") == 4 and loss_denominator(three, "sequence") == 2
    with pytest.raises(ValueError, match="aggregation"):
        loss_denominator(lengths, "batch")


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_micro_batch_gradients_sum_to_the_full_batch_gradient(aggregation):
    torch.manual_seed(0)
    rows, width = 6, 5
    mask = (torch.rand(rows, width) > 0.3).float()
    mask[:, 0] = 1.0
    behaviour = -torch.rand(rows, width)
    adv = torch.randn(rows)
    ref = -torch.rand(rows, width)
    denom = loss_denominator(mask.sum(1).numpy(), aggregation)
    kwargs = dict(clip_low=0.2, clip_high=0.28, aggregation=aggregation, denominator=denom, kl_coef=0.1)

    full = (-torch.rand(rows, width)).requires_grad_()
    grpo_loss(full, behaviour, adv, mask, ref_logp=ref, **kwargs).loss.backward()
    micro = full.detach().clone().requires_grad_()
    total = 0.0
    for part in (slice(0, 2), slice(2, 3), slice(3, 6)):
        out = grpo_loss(micro[part], behaviour[part], adv[part], mask[part], ref_logp=ref[part], **kwargs)
        out.loss.backward()
        total += float(out.loss.detach())
    torch.testing.assert_close(micro.grad, full.grad)
    whole = grpo_loss(full, behaviour, adv, mask, ref_logp=ref, **kwargs).loss.detach()
    assert total == pytest.approx(float(whole), abs=1e-6)


def test_on_policy_loss_stats_and_token_logprobs():
    # logits [0, log 3] -> softmax [0.25, 0.75]; at temperature 2 logits halve -> [1, sqrt 3] / (1 + sqrt 3)
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    target = torch.tensor([[1]])
    assert float(token_logprobs(logits, target)) == pytest.approx(math.log(0.75))
    assert float(token_logprobs(logits, target, 2.0)) == pytest.approx(math.log(math.sqrt(3) / (1 + math.sqrt(3))))
    assert float(token_logprobs(logits, target, 0.0)) == pytest.approx(math.log(0.75))  # greedy scores at T = 1
    # on-policy (logp == behaviour): ratio 1, nothing clipped, loss = -mean advantage over tokens
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    parts = grpo_loss(
        logp,
        logp.clone(),
        torch.tensor([2.0, -1.0]),
        torch.ones(2, 2),
        clip_low=0.2,
        clip_high=0.2,
        aggregation="token",
        denominator=4.0,
        kl_coef=0.0,
    )
    # tokens: -2, -2, +1, +1 -> sum -2 / 4 = -0.5
    assert float(parts.loss) == pytest.approx(-0.5)
    assert parts.ratio_sum == pytest.approx(4.0) and parts.clipped_sum == 0 and parts.abs_logratio_sum == 0
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(
            logp,
            logp,
            torch.ones(2),
            torch.ones(2, 2),
            clip_low=0.2,
            clip_high=0.2,
            aggregation="token",
            denominator=4.0,
            kl_coef=0.1,
        )


def test_lr_schedules_by_hand():
    assert [lr_factor(u, "constant", warmup=4) for u in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr_factor(5, "linear", total=10) == pytest.approx(0.5)
    assert lr_factor(5, "cosine", total=10) == pytest.approx(0.5)
    assert lr_factor(10, "cosine", total=10) == pytest.approx(0.0)
    assert lr_factor(20, "linear", total=10, min_ratio=0.1) == pytest.approx(0.1)  # stays at the floor
    with pytest.raises(ValueError, match="total"):
        lr_factor(3, "cosine")
