"""Thin adapters that put asp's schedule inside the trainers users already run: their hooks in, `asp.schedule` out.

`asp.integrations.trl`: a sampler and a callback for TRL's ``GRPOTrainer`` (``ScheduledGRPOTrainer`` wires both;
needs the ``peers`` extra). `asp.integrations.order`: `dispatch_rows`, a dataset's rows in the schedule's dispatch
order, for trainers that walk an ordered dataset (verl's ``data.custom_cls`` with ``data.shuffle=False``, OpenRLHF
with its shuffle off). The adapters never import asp's runtime, control core or trainers (an import-linter
contract holds this). How to plug asp into TRL, verl and OpenRLHF: docs/integrations.md.
"""
