"""How much generation throughput a schedule's padding can buy under a continuous-batching decode cost (pure).

A vLLM-style engine decodes a minibatch of ``sequences`` responses in S steps, S = its longest response, at a cost
of ``per_step`` seconds per step plus ``per_seq`` seconds per active sequence per step (the simulator's
``continuous`` time model without its intercept, prefill and KV terms). With the paper's padding rate
p = 1 - mean / max of the minibatch's response lengths (`asp.schedule.schedule_metrics`' P), its
T = sequences * mean tokens take ``per_step * S + per_seq * T`` seconds, so the seconds per generated token are
``per_step / (sequences * (1 - p)) + per_seq``: padding costs only through the per-step share. The ratio of two
schedules' throughputs follows from their padding rates, and so does the padding a schedule needs to reach a
given throughput gain over another, or that no padding can (when even p = 0 falls short).

These are mean-field numbers: exact when every minibatch has the same padding and token count, otherwise a
padding-weighted approximation. `benchmarks/sim_paper.py` uses them to say what the ASP paper's 106 -> 126
tokens/s/NPU would need.

Run the tests with ``.venv/bin/python -m pytest tests/sim/test_padding.py -q``.
"""

from __future__ import annotations


def _seconds_per_token(per_step: float, per_seq: float, sequences: int, padding: float) -> float:
    if per_step < 0 or per_seq < 0 or per_step + per_seq <= 0:
        raise ValueError(f"costs must be >= 0 and not both 0, got per_step={per_step}, per_seq={per_seq}")
    if sequences < 1:
        raise ValueError(f"sequences must be >= 1, got {sequences}")
    if not 0.0 <= padding < 1.0:
        raise ValueError(f"a padding rate lies in [0, 1), got {padding}")
    return per_step / (sequences * (1.0 - padding)) + per_seq


def throughput_ratio(per_step: float, per_seq: float, sequences: int, padding_from: float, padding_to: float) -> float:
    """Tokens per second at padding `padding_to` over tokens per second at `padding_from` (> 1: faster)."""
    return _seconds_per_token(per_step, per_seq, sequences, padding_from) / _seconds_per_token(
        per_step, per_seq, sequences, padding_to
    )


def padding_for_ratio(
    per_step: float, per_seq: float, sequences: int, padding_from: float, ratio: float
) -> float | None:
    """The padding rate whose throughput is `ratio` x the one at `padding_from`; None if not even 0 reaches it."""
    if ratio <= 0:
        raise ValueError(f"ratio must be > 0, got {ratio}")
    target = _seconds_per_token(per_step, per_seq, sequences, padding_from) / ratio
    step_share = target - per_seq  # = per_step / (sequences * (1 - p))
    if step_share <= 0 or per_step == 0:
        return None
    padding = 1.0 - per_step / (sequences * step_share)
    return padding if padding >= 0.0 else None
