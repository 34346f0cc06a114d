"""`LagMonitor`: the GRPO Training Unit's running timings for the policy-lag estimate (eq. 4) and the duty cycle.

Fed one `GlobalBatch` per step (`observe`), it reports the measured lag of the batch, the d_off estimate per
prompt, T_save / T_convert / T_load / T_gen / T_train and the duty cycle (`metrics`); see docs/grpo.md.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from asp.control.messages import GlobalBatch
from asp.rl.lag import d_off_estimate, duty_cycle, measured_lag


@dataclass(slots=True)
class LagMonitor:
    """Running timings for the lag estimate and duty cycle (each minibatch counted once, even when split).

    Attributes:
        t_load: recent actor reload times (s), one per reload event reported with a minibatch.
        t_train, t_save, t_convert: recent trainer step / snapshot export / conversion times (s).
        gen_total, load_total: generation and reload seconds summed over all minibatches seen.
    """

    t_load: deque[float] = field(default_factory=lambda: deque(maxlen=50))
    t_train: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    t_save: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    t_convert: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    seen: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=4096))
    gen_total: float = 0.0
    load_total: float = 0.0

    def observe(self, batch: GlobalBatch) -> None:
        """Record the reload and generation time of every minibatch in `batch` not seen before."""
        if batch.gen_s.size != batch.num_prompts:
            return
        for task, gen, reload in zip(
            batch.task_ids.tolist(), batch.gen_s.tolist(), batch.reload_s.tolist(), strict=True
        ):
            key = (task, gen)
            if key in self.seen:
                continue
            self.seen.append(key)
            self.gen_total += gen
            self.load_total += reload
            if reload > 0:
                self.t_load.append(reload)

    def metrics(self, trainer_version: int, batch: GlobalBatch) -> dict[str, float]:
        """Measured lag, the d_off estimate (mean / max over the batch's prompts), T_* and the duty cycle."""
        lag_mean, lag_max = measured_lag(trainer_version, batch.versions)
        recent = {"load": self.t_load, "train": self.t_train, "save": self.t_save, "convert": self.t_convert}
        t = {name: float(np.mean(v)) if v else 0.0 for name, v in recent.items()}
        t_gen = float(np.mean(batch.gen_s)) if batch.gen_s.size else float("nan")
        out = {"train/lag_mean": lag_mean, "train/lag_max": lag_max, "train/t_gen_s": t_gen}
        out.update({f"train/t_{k}_s": v for k, v in t.items()})
        if batch.gen_s.size == batch.num_prompts and batch.num_prompts:
            est = d_off_estimate(
                batch.depth_at_arrival,
                batch.gen_s,
                t_save=t["save"],
                t_convert=t["convert"],
                t_load=t["load"],
                t_train=t["train"],
            )
            out["train/d_off_estimate_mean"] = float(np.mean(est))
            out["train/d_off_estimate_max"] = float(np.max(est))
            out["train/q_arrival_batches_mean"] = float(np.mean(batch.depth_at_arrival))
        out["train/duty_cycle"] = duty_cycle(t_gen, t["load"]) if np.isfinite(t_gen) else float("nan")
        out["train/duty_cycle_measured"] = duty_cycle(self.gen_total, self.load_total)
        return out
