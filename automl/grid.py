"""Grid search: every combination of the listed values, each trained for a fixed number of epochs (the baseline of
Bergstra and Bengio, "Random Search for Hyper-Parameter Optimization", JMLR 2012; Cerebro, VLDB 2020, section 4.2)."""

from __future__ import annotations

import itertools
from typing import Any

from automl._base import FixedEpochsProcedure
from automl.space import Categorical, Constant, Domain


class GridSearch(FixedEpochsProcedure):
    """The Cartesian product of `space` (a dict of name -> list of values), each config trained `epochs` epochs.

    A value that is not a list or tuple is a constant (as in `automl.SearchSpace`); ranges such as
    `automl.uniform(...)` have no grid and are rejected.
    A person may add configs (each trains its own budget, `epochs` by default) or stop any; `extend(epochs=k)` trains
    every config of the grid k epochs more, those that completed the old budget included.
    """

    def __init__(self, space: dict[str, list[Any]], epochs: int) -> None:
        super().__init__(epochs)
        if not isinstance(space, dict) or not space:
            raise ValueError(f"`space` is {space!r}, but must be a non-empty dict of name -> list of values")
        for name, values in space.items():
            if isinstance(values, Domain) and not isinstance(values, (Categorical, Constant)):
                raise ValueError(f"`space[{name!r}]` is {values!r}, but a grid needs a list of values, not a range")
            if isinstance(values, (list, tuple)) and len(values) == 0:
                raise ValueError(f"`space[{name!r}]` is {values!r}, but must be a non-empty list of values")
        self.space = {k: _grid_values(v) for k, v in space.items()}

    def configs(self) -> list[dict[str, Any]]:
        names = list(self.space)
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(self.space[n] for n in names))]


def _grid_values(v: Any) -> list[Any]:
    if isinstance(v, Categorical):
        return list(v.choices)
    if isinstance(v, Constant):
        return [v.value]
    return list(v) if isinstance(v, (list, tuple)) else [v]
