"""benchmarks/profile_actors.py simulate: the GPU preset's profile (4,500 prompts, 36 minibatches of 128) predicted
on 1 and 12 engines with bench_sim's assumed workload and time model; 12 engines take 3 rounds, so the speed-up is
below 12 and above 10, and the 1-engine time is the sum of the minibatch times (a second or two)."""

from __future__ import annotations

import re


def test_simulate_prints_the_gpu_layouts_profile_time(bench_module, capsys) -> None:
    bench = bench_module("profile_actors")

    bench.main(["simulate", "--engines", "1", "12"])
    out = capsys.readouterr().out
    assert "4500 prompts x 8 samples, cap 8192, 36 minibatches of 128 prompts" in out
    rows = dict(re.findall(r"^\| (\d+) \| [\d,]+ s \([\d.]+ h\) \| ([\d.]+)x \|", out, re.M))
    assert rows["1"] == "1.00" and 10 < float(rows["12"]) < 12, out


def test_simulate_under_a_preset_prints_its_sensitivity_range(bench_module, capsys) -> None:
    bench = bench_module("profile_actors")

    bench.main(["simulate", "--engines", "1", "12", "--time-model", "h100-qwen3-8b"])
    out = capsys.readouterr().out
    assert "the published-source preset h100-qwen3-8b" in out
    cell = r"([\d,]+) s \([\d.]+ h\) \[([\d,]+)-([\d,]+) s\] \| ([\d.]+)x \[([\d.]+)-([\d.]+)x\]"
    rows = re.findall(r"^\| (\d+) \| " + cell + r" \|", out, re.M)
    got = {r[0]: [float(v.replace(",", "")) for v in r[1:]] for r in rows}
    wall, low, high, speed, s_low, s_high = got["12"]
    assert low <= wall <= high and low < high  # the decode costs x0.5-2 move the wall time
    assert s_low <= speed <= s_high and s_low > 10 and s_high < 12  # 3 rounds of 12 engines at every point
    assert got["1"][3:] == [1.0, 1.0, 1.0]
