"""Figures of the pipeline and the CLI: each module's functions take plain values and return a matplotlib figure;
`save_figure` writes it (PNG, atomically) and logs it to the stage's MLflow run.

    from asp.plots import save_figure
    from asp.plots.schedule import plot_schedule
    save_figure(plot_schedule(schedule, true_lengths), "plots/schedule.png", tracker)

* `save`: `save_figure` (re-exported here; selects the Agg backend, so importing any `asp.plots` module does);
* `schedule`: minibatch loads of a schedule; `planner`: iteration time vs devices of `asp plan layout`;
* `sim`: per-step timelines of simulated runs; `drift`: the launch run's length-drift history.

The pure core never imports this package (import-linter's pure-core contract).
"""

from asp.plots.save import save_figure

__all__ = ["save_figure"]
