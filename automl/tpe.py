"""TPE, the tree-structured Parzen estimator of HyperOpt (Bergstra, Bardenet, Bengio and Kegl, "Algorithms for
Hyper-Parameter Optimization", NeurIPS 2011), through Optuna's `TPESampler`, run in batches on Cerebro's
epoch-level template as Cerebro (VLDB 2020) section 6.3 runs HyperOpt."""

from __future__ import annotations

from typing import Any

import optuna

from automl._base import ACTIVE, ConfigState, Decision, check_states
from automl._checks import check_int, check_optional_int, check_seed
from automl._optuna import OptunaProcedure
from automl.space import SearchSpace


class TPE(OptunaProcedure):
    """`num_samples` configs from Optuna's `TPESampler(seed=seed, constant_liar=True)`, each trained `epochs` epochs.

    `concurrency` configs train at once (default: the engine's `num_workers` hint from `bind`, else 4), as
    HyperOpt's parallel mode keeps that many trials running. A batch of `concurrency` trials is asked together;
    the constant liar makes the sampler treat the running ones as bad results, so a batch spreads out. When a
    config finishes its `epochs` (all of a batch finish in the same round) its trial is told the final metric
    (COMPLETE) and its slot is filled with the next trial asked, until `num_samples` were started. Every epoch is
    reported to the trial; failed configs are told FAIL.
    """

    synchronous = False  # no epoch barrier: decide as each config finishes an epoch

    def __init__(
        self,
        space: dict[str, Any],
        num_samples: int,
        epochs: int,
        concurrency: int | None = None,
        seed: int = 0,
    ) -> None:
        self.space = SearchSpace(space)
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.epochs = check_int("epochs", epochs, 1)
        self._concurrency = check_optional_int("concurrency", concurrency, 1)
        self.seed = check_seed(seed)
        self._issued = 0
        super().__init__()

    def _make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(seed=self.sampler_seed, constant_liar=True)

    @property
    def concurrency(self) -> int:
        return self._concurrency or self.num_workers or 4

    def planned_epochs(self) -> int:
        return self.num_samples * self.epochs

    def step(self, states: list[ConfigState]) -> Decision:
        check_states(states, self._issued)
        self._report(states)
        self._tell_failed(states)
        stop = []
        for s in self._active(states):
            if s.epochs >= self.epochs:
                stop.append(s.id)
                self._tell(s, pruned=False)
        running = sum(1 for s in states if s.status == ACTIVE) - len(stop)
        add = []
        while running + len(add) < self.concurrency and self._issued < self.num_samples:
            add.append(self._ask(self._issued))
            self._issued += 1
        return Decision(add=add, stop=stop)
