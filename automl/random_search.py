"""Random search (Bergstra and Bengio, "Random Search for Hyper-Parameter Optimization", JMLR 2012)."""

from __future__ import annotations

from typing import Any

import numpy as np

from automl._base import FixedEpochsProcedure
from automl._checks import check_int, check_seed
from automl.space import SearchSpace


class RandomSearch(FixedEpochsProcedure):
    """`num_samples` configs drawn from `space` with `numpy.random.default_rng(seed)`, each trained `epochs` epochs.

    On the round template all configs start in the first round and stop together after `epochs` rounds.
    A person may add configs (each trains its own budget, `epochs` by default, outside `num_samples`) or stop any;
    `extend(samples=k)` draws k more configs, `extend(epochs=k)` trains every config k epochs more.
    """

    def __init__(self, space: dict[str, Any], num_samples: int, epochs: int, seed: int = 0) -> None:
        super().__init__(check_int("epochs", epochs, 1))
        self.space = SearchSpace(space)
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.seed = check_seed(seed)

    def extend(self, epochs: int | None = None, samples: int | None = None) -> str:
        """`samples` more configs (the next draws of the same generator) and/or `epochs` more per config."""
        if samples is None and epochs is None:
            raise ValueError("`epochs` and `samples` are both None: say what to extend")
        if epochs is not None:
            check_int("epochs", epochs, 1)  # before anything changes
        said = []
        if samples is not None:
            self.num_samples = check_int("num_samples", self.num_samples + check_int("samples", samples, 1), 1)
            said.append(f"{self.num_samples} configs in all")
        if epochs is not None:
            said.append(super().extend(epochs=epochs))
        return "; ".join(said)

    def configs(self) -> list[dict[str, Any]]:
        rng = np.random.default_rng(self.seed)
        return [self.space.sample(rng) for _ in range(self.num_samples)]
