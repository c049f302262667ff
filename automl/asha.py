"""ASHA, asynchronous successive halving (Li, Jamieson, Rostamizadeh, Gonina, Ben-tzur, Hardt, Recht and Talwalkar,
"A System for Massively Parallel Hyperparameter Tuning", MLSys 2020), emulated on Cerebro's epoch-level template
as in Cerebro (VLDB 2020) section 6.3 and appendix E.2."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna

from automl._base import ACTIVE, ConfigState, Decision, check_states
from automl._checks import check_int, check_optional_int, check_positive_real, check_seed
from automl._optuna import OptunaProcedure
from automl.space import SearchSpace


def asha_rungs(max_epochs: int, eta: int = 3, min_epochs: int = 1) -> list[int]:
    """Epochs at which ASHA ranks a config: min_epochs * eta^k below max_epochs, then max_epochs (the top rung).

    `asha_rungs(9, 3, 1) == [1, 3, 9]`, Cerebro's setting (R = 9, eta = 3).
    """
    rungs = []
    r = min_epochs
    while r < max_epochs:
        rungs.append(r)
        r *= eta
    return [*rungs, max_epochs]


def asha_promotable(score: float, config_id: int, recorded: list[tuple[float, int]], eta: int) -> bool:
    """Whether a result is in the top 1/eta of the `(score, id)` results recorded at its rung (itself included).

    Higher scores are better, ties go to the smaller id; at least the best one is promoted, so the first results at
    a rung are not all stopped (Optuna's SuccessiveHalvingPruner and Ray Tune's ASHA do the same).
    """
    k = max(1, len(recorded) // eta)
    better = sum(1 for s, i in recorded if (s, -i) > (score, -config_id))
    return better < k


class ASHA(OptunaProcedure):
    """ASHA with a fixed number of configs training at once (Cerebro's emulation: `|S|` = number of workers).

    Rungs are at `asha_rungs(max_epochs, eta, min_epochs)` epochs. The procedure keeps `num_workers` configs
    active (the engine's hint from `bind`, else 4). Each round, every config that reached a rung records its
    metric there; once all of the round's results are recorded, each one is promoted (keeps training to the next
    rung, from its weights) if it is in the top 1/eta of everything recorded at that rung so far, else it is
    stopped (Optuna trial PRUNED). Configs that reach `max_epochs` stop (trial COMPLETE with the final value).
    Freed slots are filled with new configs asked from an Optuna study with a seeded `RandomSampler` until
    `max_configs` configs were started or `time_budget_s` seconds (measured by `clock`, from the first `step`)
    are spent; the configs already running then finish their rungs. Every epoch is reported to the trial.

    ASHA needs no epoch barrier (`synchronous = False`): a config is ranked at its rung as soon as it gets there,
    against everything recorded at that rung so far, and a freed slot is filled at once, as in task-parallel ASHA.
    Unlike task-parallel ASHA, a config that is not promoted on arrival is stopped and never resumed (the template
    cannot pause a config). Run under a barrier (`deterministic=True`, or the offline runner), each decision sees
    every result of its round (Cerebro E.2).
    At least one of `max_configs` and `time_budget_s` must be given, so the run ends.

    Configs a person steers: a config a person adds is not a trial; it trains its own budget (`max_epochs` by
    default), is not ranked at the rungs and does not count towards `max_configs`, but it holds one of the
    `num_workers` slots while it trains. A config a person stops frees its slot (its trial stays as it was: a
    stopped trial is never told a result it did not reach). `extend(samples=k)` raises `max_configs` by k.
    """

    synchronous = False  # no epoch barrier: decide as each config finishes an epoch

    def __init__(
        self,
        space: dict[str, Any],
        max_epochs: int,
        eta: int = 3,
        min_epochs: int = 1,
        max_configs: int | None = None,
        time_budget_s: float | None = None,
        seed: int = 0,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.space = SearchSpace(space)
        self.space.to_optuna()  # a domain Optuna cannot search (randn) raises here, before any work
        self.max_epochs = check_int("max_epochs", max_epochs, 1)
        self.eta = check_int("eta", eta, 2)
        self.min_epochs = check_int("min_epochs", min_epochs, 1)
        if self.max_epochs < self.min_epochs:
            raise ValueError(f"`max_epochs` is {max_epochs!r}, but must be >= `min_epochs` ({min_epochs!r})")
        self.max_configs = check_optional_int("max_configs", max_configs, 1)
        self.time_budget_s = None if time_budget_s is None else check_positive_real("time_budget_s", time_budget_s)
        if self.max_configs is None and self.time_budget_s is None:
            raise ValueError("`max_configs` and `time_budget_s` are both None, but at least one must be given")
        if not callable(clock):
            raise TypeError(f"`clock` is {clock!r}, but must be a callable returning seconds")
        self.clock = clock
        self.seed = check_seed(seed)
        self.rungs = asha_rungs(self.max_epochs, self.eta, self.min_epochs)
        self.recorded: list[list[tuple[float, int]]] = [[] for _ in self.rungs]  # per rung: (score, id)
        self._issued = 0
        self._start: float | None = None
        self._ranked: dict[int, int] = {}  # id -> epochs at which it was last looked at (not ranked twice)
        super().__init__()

    def _make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=self.sampler_seed)

    def epochs_per_config(self) -> int:
        return self.max_epochs

    def extend(self, epochs: int | None = None, samples: int | None = None) -> str:
        return self._extend_samples("max_configs", epochs, samples)

    @property
    def concurrency(self) -> int:
        """Configs kept training at once: the engine's `num_workers` hint (from `bind`, `workers_changed`), else 4."""
        return self.num_workers or 4

    def _can_add(self) -> bool:
        if self.max_configs is not None and self._issued >= self.max_configs:
            return False
        return self.time_budget_s is None or self.clock() - self._start < self.time_budget_s

    def step(self, states: list[ConfigState]) -> Decision:
        if self._start is None:
            self._start = self.clock()
        check_states(states, self._issued)
        self._report(states)
        self._tell_failed(states)
        self._tell_completed(states, self.max_epochs)
        stop: list[int] = []
        pruned: list[int] = []
        arrivals: list[tuple[int, ConfigState]] = []
        ranked = vars(self).setdefault("_ranked", {})
        for s in self._active(states):
            if ranked.get(s.id) == s.epochs:
                continue  # no epoch finished since the last look (without a barrier it is mid-epoch)
            ranked[s.id] = s.epochs
            if s.epochs >= self.max_epochs:
                stop.append(s.id)
                self._tell(s, pruned=False)
            elif s.epochs in self.rungs:
                k = self.rungs.index(s.epochs)
                self.recorded[k].append((self.score(s), s.id))
                arrivals.append((k, s))
        for k, s in arrivals:
            if not asha_promotable(self.score(s), s.id, self.recorded[k], self.eta):
                stop.append(s.id)
                pruned.append(s.id)
                self._tell(s, pruned=True)
        running = sum(1 for s in states if s.status == ACTIVE) - len(stop)
        add = []
        while running + len(add) < self.concurrency and self._can_add():
            add.append(self._ask(len(states) + len(add)))
            self._issued += 1
        return Decision(add=add, stop=sorted(stop), pruned=sorted(pruned))
