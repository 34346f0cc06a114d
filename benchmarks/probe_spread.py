"""How repeatable the sharing probe is: several probes of one engine side by side, each slowdown with its 90 %
interval over the probe's rounds (`asp.sim.sharing.probe_intervals`; `probe_spread_warning` warns when one is wide),
and how many of the other probes' values each interval holds, as it is and widened by `SITTING_WIDTH` (the range
`asp simulate` shows).

The intervals take a probe's ratios as independent draws. The ratios of one round share that round's baselines, and
the machine's speed moves between sittings, so an interval holds fewer of the other probes' values than its level
says: the last table counts them, which is how `SITTING_WIDTH` was chosen (on vLLM probes) and checked (on hf
probes). Reads only the probe files (`asp simulate probe-sharing --out FILE` writes one); seconds, no engine.

    .venv/bin/python benchmarks/probe_spread.py metrics/sharing_probe.json other/sharing_probe.json
    .venv/bin/python benchmarks/probe_spread.py "morning=a.json" "noon=b.json"     # LABEL=FILE names a probe
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from asp.errors import exit_user_error
from asp.sim.sharing import PROBE_LEVEL, SITTING_WIDTH, probe_intervals

Cell = tuple[int, bool, str]


def cell_name(cell: Cell) -> str:
    """A column title: 'k alone', 'k + step: call' or 'k + step: step'."""
    k, training, kind = cell
    return f"{k} alone" if not training else f"{k} + step: {kind}"


Intervals = dict[Cell, tuple[float, float, float]]


def load(arg: str) -> tuple[str, dict, Intervals, Intervals]:
    """(label, record, intervals, intervals widened by `SITTING_WIDTH`) of a ``[LABEL=]FILE`` argument; exits with a
    message naming a bad file."""
    label, _, name = arg.rpartition("=")
    path = Path(name)
    try:
        record = json.loads(path.read_text())
        intervals = probe_intervals(record)
        wide = probe_intervals(record, widen=SITTING_WIDTH)
    except (OSError, ValueError, AttributeError) as exc:
        exit_user_error(f"{path}: not a sharing probe ({exc}); `asp simulate probe-sharing --out FILE` writes one")
    if not intervals or not wide:
        exit_user_error(f"{path}: keeps no per-round ratios (rounds_ratios); re-run `asp simulate probe-sharing`")
    return label or path.stem, record, intervals, wide


def held(intervals: list[Intervals], cell: Cell) -> tuple[int, int]:
    """(how many (probe, other probe) pairs have the other's value inside the probe's interval, pairs) (pure)."""
    inside = pairs = 0
    for i, a in enumerate(intervals):
        for j, b in enumerate(intervals):
            if i != j and cell in a and cell in b:
                pairs += 1
                inside += a[cell][1] <= b[cell][0] <= a[cell][2]
    return inside, pairs


def share(inside: int, pairs: int) -> str:
    return f"{inside} of {pairs} ({100 * inside / max(pairs, 1):.0f} %)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probes", nargs="+", help="sharing probe files ([LABEL=]FILE)")
    args = parser.parse_args(argv)
    probes = [load(a) for a in args.probes]
    engines = min(len(r["generation_slowdown"]) for _, r, _, _ in probes)
    cells = [
        c for c in sorted({c for _, _, iv, _ in probes for c in iv}) if c[0] <= engines and c != (1, False, "call")
    ]
    print(f"Each cell: the slowdown [its {100 * PROBE_LEVEL:.0f} % interval over the probe's rounds]")
    print(
        "| probe | engine, date | calls (prompts), rounds | step alone (s) | "
        + " | ".join(map(cell_name, cells))
        + " |"
    )
    print("|---" * (4 + len(cells)) + "|")
    for label, record, intervals, _ in probes:
        row = [
            label,
            f"{record.get('engine', '?')}, {record.get('date', '?')}",
            f"{record.get('prompts_per_call', '?')}, {record.get('repeats', '?')}",
            f"{record.get('alone_step_s', float('nan')):.3f}",
        ]
        for c in cells:
            mid, lo, hi = intervals.get(c, (float("nan"),) * 3)
            row.append(f"{mid:.3f} [{lo:.3f}-{hi:.3f}]")
        print("| " + " | ".join(row) + " |")
    print()
    print(
        "| slowdown | probes' values (min-max) | widest interval (± % of its value) | other probes' values inside "
        f"the interval | inside it {SITTING_WIDTH:g}x as wide |"
    )
    print("|---|---|---|---|---|")
    totals = [0, 0, 0]
    for c in cells:
        values = [iv[c][0] for _, _, iv, _ in probes if c in iv]
        widest = max((iv[c][2] - iv[c][1]) / 2 / iv[c][0] for _, _, iv, _ in probes if c in iv)
        inside, pairs = held([iv for _, _, iv, _ in probes], c)
        wide, _ = held([w for *_, w in probes], c)
        totals = [totals[0] + inside, totals[1] + wide, totals[2] + pairs]
        print(
            f"| {cell_name(c)} | {min(values):.3f}-{max(values):.3f} | ±{100 * widest:.1f} % | {share(inside, pairs)} "
            f"| {share(wide, pairs)} |"
        )
    print(f"| all | | | {share(totals[0], totals[2])} | {share(totals[1], totals[2])} |")
    print(f"(the intervals' level: {100 * PROBE_LEVEL:.0f} %)")


if __name__ == "__main__":
    main()
