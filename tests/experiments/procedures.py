"""A user's own procedure, run by `experiments/automl_on_mop.py --procedure tests.experiments.procedures:LearningRates
--procedure-args '{"lrs": [...], "epochs": N}'`."""

from __future__ import annotations

from typing import Any

from automl import FixedEpochsProcedure


class LearningRates(FixedEpochsProcedure):
    """One MLP config per learning rate in `lrs` (hidden width `hidden`), each trained `epochs` epochs."""

    def __init__(self, lrs: list[float], epochs: int, hidden: int = 16) -> None:
        super().__init__(epochs)
        if not lrs:
            raise ValueError(f"`lrs` is {lrs!r}, but must name at least one learning rate")
        self.lrs, self.hidden = list(lrs), hidden

    def configs(self) -> list[dict[str, Any]]:
        return [{"lr": lr, "hidden": self.hidden, "batch_size": 64} for lr in self.lrs]
