"""TPE, the tree-structured Parzen estimator of HyperOpt (Bergstra, Bardenet, Bengio and Kegl, "Algorithms for
Hyper-Parameter Optimization", NeurIPS 2011), through Optuna's `TPESampler`, run in batches on Cerebro's
epoch-level template as Cerebro (VLDB 2020) section 6.3 runs HyperOpt: a preset of `OptunaSearch`."""

from __future__ import annotations

from typing import Any

from automl.optuna_search import OptunaSearch


class TPE(OptunaSearch):
    """`num_samples` configs from Optuna's `TPESampler(seed=seed, constant_liar=True)`, each trained `epochs` epochs:
    `OptunaSearch(space, num_samples, epochs, sampler="tpe", concurrency=concurrency, seed=seed)`.

    `concurrency` configs train at once (default: the engine's `num_workers` hint from `bind`, else 4), as
    HyperOpt's parallel mode keeps that many trials running. A batch of `concurrency` trials is asked together;
    the constant liar makes the sampler treat the running ones as bad results, so a batch spreads out. When a
    config finishes its `epochs` (all of a batch finish in the same round) its trial is told the final metric
    (COMPLETE) and its slot is filled with the next trial asked, until `num_samples` were started. Every epoch is
    reported to the trial; failed configs are told FAIL. For another sampler, a pruner, configs to try first, a
    conditional space or several objectives, use `OptunaSearch`.
    """

    def __init__(
        self,
        space: dict[str, Any],
        num_samples: int,
        epochs: int,
        concurrency: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(space, num_samples, epochs, sampler="tpe", concurrency=concurrency, seed=seed)
