"""BOHB (Falkner, Klein and Hutter, "BOHB: Robust and Efficient Hyperparameter Optimization at Scale", ICML 2018):
HyperBand's brackets, with each new bracket's configs proposed by a TPE model of the results at the largest budget
that has enough of them. Ray Tune's `TuneBOHB` + `HyperBandForBOHB` (hpbandster's KDE); here the model is Optuna's
`TPESampler` (multivariate, as BOHB's KDE), told the results at that budget through ask-and-tell."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import optuna

from automl._base import ACTIVE, PROCEDURE, ConfigState, Decision, check_states
from automl._checks import check_fraction, check_int, check_optional_int
from automl._optuna import quiet_optuna
from automl.hyperband import HyperBand


class BOHB(HyperBand):
    """HyperBand brackets (`automl.HyperBand`: the bracket table of `hyperband_brackets(max_epochs, eta)`, repeated
    `iterations` times, each bracket running successive halving on its configs with rung decisions of its own) whose
    configs come from a model once there are results to fit it on.

    Brackets start one after another, in the table's order (most configs first), each as soon as fewer configs are
    training than `concurrency` (default: the engine's `num_workers` hint, else 4): the first bracket starts in the
    first round, the next when the first has halved below the workers, and so on (Falkner et al. section 4.2: a new
    bracket is sampled whenever a worker is idle). With `concurrency` at least the first rung of every bracket, they
    all start together as in `HyperBand` (and the model is never used).

    Each config of a new bracket is drawn from `space` with probability `random_fraction` (BOHB's rho), else proposed
    by TPE (Optuna's `TPESampler(multivariate=True, n_startup_trials=0, n_ei_candidates=n_ei_candidates)`, whose good
    density holds the best 10% of the results, at most 25, where hpbandster's holds 15%) fitted on the results at budget b: the largest
    rung budget (epochs) at which at least `min_points_in_model + 2` configs have a result (BOHB's N_min + 2;
    `min_points_in_model` defaults to the number of searched hyper-parameters + 1). Every config the procedure
    started that trained b epochs has a result at b (its metric after epoch b). Without such a budget every config is
    drawn from `space`. `model_budget[id]` says which budget's model proposed a config (None: drawn from `space`).

    Deterministic under `seed`: the draws and the TPE seeds come from one generator, and the model is rebuilt from
    the results each time (nothing but the generator and the bracket bookkeeping is kept between steps, so the
    procedure pickles small). The space must be one Optuna can search (`randn` raises at construction). Configs a
    person steers are outside the brackets, as in `HyperBand`, and their results do not feed the model; they count
    towards the configs training when the next bracket's start is decided. The budget cannot be extended.
    """

    def __init__(
        self,
        space: dict[str, Any],
        max_epochs: int,
        eta: int = 3,
        seed: int = 0,
        iterations: int = 1,
        *,
        concurrency: int | None = None,
        min_points_in_model: int | None = None,
        random_fraction: float = 1 / 3,
        n_ei_candidates: int = 24,
    ) -> None:
        super().__init__(space, max_epochs, eta, seed, iterations)
        self.space.to_optuna()  # a domain Optuna cannot search (randn) raises here, before any work
        self._concurrency = check_optional_int("concurrency", concurrency, 1)
        self.min_points_in_model = check_optional_int("min_points_in_model", min_points_in_model, 1)
        if self.min_points_in_model is None:
            self.min_points_in_model = len(self.space.searched) + 1
        self.random_fraction = check_fraction("random_fraction", random_fraction)
        self.n_ei_candidates = check_int("n_ei_candidates", n_ei_candidates, 1)
        self._rng = np.random.default_rng(self.seed)
        #: config id -> the budget (epochs) whose model proposed it, or None when it was drawn from `space`
        self.model_budget: dict[int, int | None] = {}

    @property
    def concurrency(self) -> int:
        """Configs kept training before the next bracket starts: the `concurrency` argument, else the engine's
        `num_workers` hint (from `bind`, `workers_changed`), else 4."""
        return self._concurrency or self.num_workers or 4

    @property
    def budgets(self) -> list[int]:
        """The rung budgets (epochs) of the bracket table, smallest first."""
        return sorted({rung.r for bracket in self.brackets for rung in bracket.rungs})

    def observations(self, states: list[ConfigState]) -> dict[int, list[tuple[dict[str, Any], float]]]:
        """Budget -> `(config, score)` of every config the procedure started that has a finite result after that
        many epochs (score: the metric as a value to maximise), in id order."""
        out: dict[int, list[tuple[dict[str, Any], float]]] = {}
        for r in self.budgets:
            out[r] = [(s.config, v) for s in states if s.origin == PROCEDURE and s.epochs >= r
                      and math.isfinite(v := self.score(s, epochs=r))]
        return out

    def model_of(self, states: list[ConfigState]) -> int | None:
        """The budget the next proposals are modelled on: the largest with at least `min_points_in_model + 2`
        results, or None."""
        enough = [r for r, obs in self.observations(states).items() if len(obs) >= self.min_points_in_model + 2]
        return max(enough, default=None)

    def _propose(self, states: list[ConfigState], n: int, first_id: int) -> list[dict[str, Any]]:
        """`n` configs for a new bracket whose first config gets the id `first_id`."""
        budget = self.model_of(states)
        study: optuna.Study | None = None
        configs = []
        for i in range(n):
            if budget is None or self._rng.random() < self.random_fraction:
                configs.append(self.space.sample(self._rng))
                self.model_budget[first_id + i] = None
                continue
            if study is None:
                study = self._study(self.observations(states)[budget])
            trial = study.ask(self.space.to_optuna())
            configs.append(self.space.from_optuna(trial.params))
            self.model_budget[first_id + i] = budget
        return configs

    def _study(self, observations: list[tuple[dict[str, Any], float]]) -> optuna.Study:
        """An in-memory study told `observations`, whose TPE sampler (seeded from the generator) proposes configs."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=int(self._rng.integers(1 << 32)), n_startup_trials=0, multivariate=True,
                n_ei_candidates=self.n_ei_candidates,
            )
        with quiet_optuna():  # (a study per bracket is a detail: keep Optuna's "A new study created" line out)
            study = optuna.create_study(direction="maximize", sampler=sampler)
        distributions = self.space.to_optuna()
        study.add_trials([
            optuna.trial.create_trial(params=self.space.to_optuna_params(c), distributions=distributions, value=v)
            for c, v in observations
        ])
        return study

    def step(self, states: list[ConfigState]) -> Decision:
        check_states(states, self._issued)
        stop: list[int] = []
        pruned: list[int] = []
        for b in range(len(self._members)):
            self._advance(b, states, stop, pruned)
        running = sum(1 for s in states if s.status == ACTIVE) - len(stop)
        add: list[dict[str, Any]] = []
        while len(self._members) < len(self.brackets) and running + len(add) < self.concurrency:
            n0 = self.brackets[len(self._members)].rungs[0].n
            first = len(states) + len(add)
            self._members.append(list(range(first, first + n0)))
            self._rung.append(0)
            add.extend(self._propose(states, n0, first))
        self._issued += len(add)
        return Decision(add=add, stop=sorted(stop), pruned=sorted(pruned))
