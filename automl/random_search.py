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
    """

    def __init__(self, space: dict[str, Any], num_samples: int, epochs: int, seed: int = 0) -> None:
        super().__init__(check_int("epochs", epochs, 1))
        self.space = SearchSpace(space)
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.seed = check_seed(seed)

    def configs(self) -> list[dict[str, Any]]:
        rng = np.random.default_rng(self.seed)
        return [self.space.sample(rng) for _ in range(self.num_samples)]
