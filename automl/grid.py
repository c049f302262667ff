"""Grid search: every combination of the listed values, each trained for a fixed number of epochs (the baseline of
Bergstra and Bengio, "Random Search for Hyper-Parameter Optimization", JMLR 2012; Cerebro, VLDB 2020, section 4.2).

The grid is over lists only (`automl.choice(...)` and Ray Tune's `tune.grid_search([...])` and `tune.choice([...])`
are lists too). GridSearch draws nothing (it has no seed), so a random domain (`uniform`, `quniform`,
`randn`, ...) is rejected with an error rather than drawn once per grid point as Ray Tune's grid does; a nested space
(a dict holding a domain) is rejected too. A `sample_from` value is computed at every grid point from the rest of
the config."""

from __future__ import annotations

import itertools
from typing import Any

from automl._base import FixedEpochsProcedure
from automl._checks import json_exact
from automl.space import Categorical, Constant, Domain, SampleFrom, _fn_name, _is_nested, convert_tune


class GridSearch(FixedEpochsProcedure):
    """The Cartesian product of `space` (a dict of name -> list of values), each config trained `epochs` epochs.

    A value that is not a list or tuple is a constant (as in `automl.SearchSpace`); ranges such as
    `automl.uniform(...)` have no grid and are rejected, as are nested spaces; an `automl.sample_from(fn)` value is
    `fn(config)` at each grid point, computed after the lists in key order.
    A person may add configs (each trains its own budget, `epochs` by default) or stop any; `extend(epochs=k)` trains
    every config of the grid k epochs more, those that completed the old budget included.
    """

    def __init__(self, space: dict[str, list[Any]], epochs: int) -> None:
        super().__init__(epochs)
        if not isinstance(space, dict) or not space:
            raise ValueError(f"`space` is {space!r}, but must be a non-empty dict of name -> list of values")
        # Ray Tune's grids (`{"grid_search": [...]}`) and choices are axes, its ranges our domains (refused below)
        space = convert_tune("space", space, grid=True)
        for name, values in space.items():
            if isinstance(values, Domain) and not isinstance(values, (Categorical, Constant, SampleFrom)):
                raise ValueError(f"`space[{name!r}]` is {values!r}, but a grid needs a list of values, not a random "
                                 "domain (GridSearch draws nothing: use RandomSearch)")
            if _is_nested(values):
                raise ValueError(f"`space[{name!r}]` is {values!r}, a nested space, but GridSearch grids over "
                                 "top-level lists only (a dict without domains is a constant)")
            if isinstance(values, (list, tuple)) and len(values) == 0:
                raise ValueError(f"`space[{name!r}]` is {values!r}, but must be a non-empty list of values")
        self.space = {k: _grid_values(k, v) for k, v in space.items()}

    def configs(self) -> list[dict[str, Any]]:
        names = [n for n, v in self.space.items() if not isinstance(v, SampleFrom)]
        out = []
        for combo in itertools.product(*(self.space[n] for n in names)):
            partial = dict(zip(names, combo, strict=True))
            for n, v in self.space.items():
                if isinstance(v, SampleFrom):
                    value = v.compute(partial)
                    try:  # (a config holds JSON values only: `automl.json_exact`)
                        partial[n] = json_exact(f"space[{n!r}]", value)
                    except (TypeError, ValueError) as e:
                        raise type(e)(f"{e} (what sample_from({_fn_name(v.fn)}) returned)") from None
            out.append({n: partial[n] for n in self.space})
        return out


def _grid_values(name: str, v: Any) -> list[Any] | SampleFrom:
    """The values of `space[name]` on the grid, as a config holds them (`automl.json_exact`)."""
    if isinstance(v, SampleFrom):
        return v
    if isinstance(v, Categorical):
        return list(v.choices)
    if isinstance(v, Constant):
        return [v.value]
    if isinstance(v, (list, tuple)):
        return [json_exact(f"space[{name!r}][{i}]", x) for i, x in enumerate(v)]
    return [json_exact(f"space[{name!r}]", v)]
