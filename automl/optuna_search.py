"""Any Optuna sampler and pruner on Cerebro's epoch-level template: `OptunaSearch`.

Optuna (Akiba, Sano, Yanase, Ohta and Koyama, KDD 2019) asks trials one at a time and learns from what it is told;
here a trial is a config the engine trains for `epochs` epochs on its workers, `concurrency` of them at once. Every
epoch is reported to the trial (the pruner's input), every end is told (the sampler's), and the study lives in the
run's `optuna.db`, so `optuna.load_study(storage="sqlite:///<run>/optuna.db", study_name=procedure.study_name)` and
optuna-dashboard read it while the run goes on and after.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import optuna

from automl._base import ACTIVE, ConfigState, Decision, check_states
from automl._checks import check_int, check_optional_int, check_seed, json_exact
from automl._optuna import OptunaProcedure
from automl.space import SearchSpace

#: sampler names `OptunaSearch(sampler=...)` takes -> factory(seed) (any `optuna.samplers.BaseSampler` works too)
SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "tpe": lambda seed: optuna.samplers.TPESampler(seed=seed, constant_liar=True),
    "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
    "cmaes": lambda seed: optuna.samplers.CmaEsSampler(seed=seed),
    "gp": lambda seed: optuna.samplers.GPSampler(seed=seed),
    "qmc": lambda seed: optuna.samplers.QMCSampler(seed=seed),
    "nsga2": lambda seed: optuna.samplers.NSGAIISampler(seed=seed),
    "nsga3": lambda seed: optuna.samplers.NSGAIIISampler(seed=seed),
}

#: pruner names `OptunaSearch(pruner=...)` takes -> factory() (any `optuna.pruners.BasePruner` works too)
PRUNERS: dict[str, Callable[[], optuna.pruners.BasePruner]] = {
    "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
    "successive_halving": lambda: optuna.pruners.SuccessiveHalvingPruner(),
    "hyperband": lambda: optuna.pruners.HyperbandPruner(),
}


class OptunaSearch(OptunaProcedure):
    """`num_samples` configs from any Optuna sampler, each trained up to `epochs` epochs, `concurrency` at once.

    Args:
        space: a search space dict (see `automl.space`; `randn` and `qrandn` raise, since Optuna has no normal
            distribution; a nested space's parameters are named "outer/inner" in the study), or a define-by-run
            function `fn(trial) -> dict | None` that calls `trial.suggest_*` and may branch on what it drew (a
            conditional space: e.g. `momentum` only when `optimizer == "sgd"`); it returns the config (constants
            included), or None for `trial.params`. It must be a module-level function, since the procedure is
            pickled with the run.
        num_samples: configs to train in all, `points_to_evaluate` included (as in Ray Tune).
        epochs: epochs per config (fewer when the pruner stops it).
        sampler: an `optuna.samplers.BaseSampler`, or a name in `SAMPLERS`: "tpe" (the default for one
            objective, with the constant liar), "random", "cmaes", "gp", "qmc", "nsga2" (the default for several
            objectives), "nsga3". A name is seeded with `seed`; an instance keeps its own seed.
        pruner: an `optuna.pruners.BasePruner`, a name in `PRUNERS` ("median", "successive_halving",
            "hyperband"), or None (no pruning). It is asked after every epoch; a pruned config stops (`pruned`).
            Optuna prunes one objective only.
        points_to_evaluate: configs to train first, in order (Ray Tune's `points_to_evaluate`, Optuna's
            `enqueue_trial`); with a space dict each must lie in it, with a define-by-run space its keys are the
            names `fn` suggests.
        metric, mode: what the study optimises. None: the run's (`ModelSelection(metric, mode)`). Lists of equal
            length for several objectives (e.g. `["valid_loss", "train_time_s"]`, `["min", "min"]`); rank such a
            run's configs with `Result.get_dataframe(metric=[...], mode=[...])` (a `pareto_rank` column) and
            `Result.get_best_results(...)` (the Pareto front).
        concurrency: configs training at once (default: the engine's `num_workers` hint, else 4). A batch asked
            together is spread out by the sampler's own handling of running trials (TPE's constant liar).
        seed: seeds a named sampler.

    Every epoch is reported to the trial (`trial.report(value, step=epoch)`, 0-based as in `Result.metrics`; with
    several objectives as the trial's user attribute `epoch_<e>`, since Optuna keeps no intermediate values there);
    a config that finishes its epochs is told COMPLETE with its last values, a pruned one PRUNED, a failed one FAIL.

    Configs a person steers: a config a person adds is not a trial (the study does not learn from it); it trains
    its own budget (`epochs` by default) outside `num_samples`, but holds one of the `concurrency` slots while it
    trains. A trial a person stops frees its slot and stays RUNNING in the study (it was never finished).
    `extend(samples=k)` raises `num_samples` by k.
    """

    synchronous = False  # no epoch barrier: decide as each config finishes an epoch
    points_to_evaluate: list[dict[str, Any]] = []  # noqa: RUF012 - read-only default (a TPE pickled before it existed)
    _sampler_spec: str | optuna.samplers.BaseSampler | None = None
    _enqueued = False

    def __init__(
        self,
        space: dict[str, Any] | Callable[[optuna.Trial], dict[str, Any] | None],
        num_samples: int,
        epochs: int,
        *,
        sampler: str | optuna.samplers.BaseSampler | None = None,
        pruner: str | optuna.pruners.BasePruner | None = None,
        points_to_evaluate: Sequence[dict[str, Any]] | None = None,
        metric: str | Sequence[str] | None = None,
        mode: str | Sequence[str] | None = None,
        concurrency: int | None = None,
        seed: int = 0,
    ) -> None:
        if callable(space) and not isinstance(space, dict):
            self.space, self.define_by_run = None, space
        else:
            self.space = SearchSpace(space)
            self.space.to_optuna()  # a domain Optuna cannot search (randn) raises here, before any work
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.epochs = check_int("epochs", epochs, 1)
        self._concurrency = check_optional_int("concurrency", concurrency, 1)
        self.seed = check_seed(seed)
        self._set_objectives(metric, mode)
        self._sampler_spec = _check_sampler(sampler)
        self.pruner = _make_pruner(pruner)
        if self.pruner is not None and len(self.objectives) > 1:
            raise ValueError(f"`pruner` is {pruner!r}, but Optuna prunes one objective and `metric` is {metric!r}: "
                             "pass pruner=None")
        self.points_to_evaluate = self._check_points(points_to_evaluate)
        self._enqueued = False
        self._issued = 0
        super().__init__()

    def _set_objectives(self, metric: Any, mode: Any) -> None:
        if isinstance(metric, (list, tuple)):
            if not metric or not all(isinstance(m, str) for m in metric):
                raise ValueError(f"`metric` is {metric!r}, but a list of metrics must hold at least one str")
            if not isinstance(mode, (list, tuple)) or len(mode) != len(metric):
                raise ValueError(f"`mode` is {mode!r}, but `metric` is a list of {len(metric)}: pass a list of as "
                                 "many modes ('min' or 'max')")
            bad = [m for m in mode if m not in ("min", "max")]
            if bad:
                raise ValueError(f"`mode` is {mode!r}, but every mode must be 'min' or 'max' ({bad[0]!r} is not)")
            if len(set(metric)) != len(metric):
                raise ValueError(f"`metric` is {metric!r}, but names a metric twice")
            self.metric, self.mode = list(metric), list(mode)
        elif metric is not None:
            if not isinstance(metric, str):
                raise TypeError(f"`metric` is {metric!r}, but must be a str, a list of str, or None")
            if mode not in ("min", "max"):
                raise ValueError(f"`mode` is {mode!r}, but `metric` is {metric!r}: pass mode='min' or mode='max'")
            self.metric, self.mode = metric, mode
        elif mode is not None:
            raise ValueError(f"`mode` is {mode!r}, but `metric` is None: give both, or neither (the run's)")

    def _check_points(self, points: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
        if points is None:
            return []
        if isinstance(points, dict) or not isinstance(points, (list, tuple)):
            raise TypeError(f"`points_to_evaluate` is {points!r}, but must be a list of config dicts")
        points = list(points)
        for i, p in enumerate(points):
            if not isinstance(p, dict):
                raise TypeError(f"`points_to_evaluate[{i}]` is {p!r}, but must be a config dict")
            p = points[i] = json_exact(f"points_to_evaluate[{i}]", p)  # (a tuple becomes a list, as in the space)
            if self.space is not None and not self.space.contains(p):
                raise ValueError(f"`points_to_evaluate[{i}]` is {p!r}, but must lie in the space {self.space.raw!r} "
                                 "(the same keys, every value in its domain)")
        if len(points) > self.num_samples:
            raise ValueError(f"`points_to_evaluate` holds {len(points)} configs, but `num_samples` is "
                             f"{self.num_samples}: they count towards it")
        return [dict(p) for p in points]

    def _make_sampler(self) -> optuna.samplers.BaseSampler:
        spec = self._sampler_spec
        if spec is None:
            spec = "nsga2" if len(self.objectives) > 1 else "tpe"
        return SAMPLERS[spec](self.sampler_seed) if isinstance(spec, str) else spec

    @property
    def concurrency(self) -> int:
        """Configs kept training at once: the `concurrency` argument, else the engine's `num_workers` hint, else 4."""
        return self._concurrency or self.num_workers or 4

    def planned_epochs(self) -> int:
        return self.num_samples * self.epochs

    def epochs_per_config(self) -> int:
        return self.epochs

    def extend(self, epochs: int | None = None, samples: int | None = None) -> str:
        return self._extend_samples("num_samples", epochs, samples)

    def _enqueue_points(self) -> None:
        """Put `points_to_evaluate` first in the study's queue (once: the queue is kept in the study)."""
        if self._enqueued:
            return
        self._enqueued = True
        for p in self.points_to_evaluate:
            params = p if self.space is None else self.space.to_optuna_params(p)
            self.study.enqueue_trial(params)

    def step(self, states: list[ConfigState]) -> Decision:
        check_states(states, self._issued)
        self._enqueue_points()
        self._report(states)
        self._tell_failed(states)
        self._tell_completed(states, self.epochs)
        stop, pruned = [], []
        for s in self._active(states):
            if s.epochs >= self.epochs:
                stop.append(s.id)
                self._tell(s, pruned=False)
            elif self._should_prune(s):
                stop.append(s.id)
                pruned.append(s.id)
                self._tell(s, pruned=True)
        running = sum(1 for s in states if s.status == ACTIVE) - len(stop)
        add = []
        while running + len(add) < self.concurrency and self._issued < self.num_samples:
            add.append(self._ask(len(states) + len(add)))
            self._issued += 1
        return Decision(add=add, stop=stop, pruned=pruned)


#: what a named sampler imports besides Optuna (the `samplers` extra installs them)
_NEEDS = {"cmaes": "cmaes", "gp": "scipy", "qmc": "scipy"}


def _check_sampler(sampler: Any) -> str | optuna.samplers.BaseSampler | None:
    if sampler is None or isinstance(sampler, optuna.samplers.BaseSampler):
        return sampler
    if isinstance(sampler, str) and sampler in SAMPLERS:
        module = _NEEDS.get(sampler)
        if module is not None and importlib.util.find_spec(module) is None:
            raise ImportError(f"`sampler` is {sampler!r}, which needs the package {module!r}: "
                              "pip install 'modelhopper[samplers]'")
        return sampler
    raise ValueError(f"`sampler` is {sampler!r}, but must be None, an optuna.samplers.BaseSampler or one of "
                     f"{sorted(SAMPLERS)}")


def _make_pruner(pruner: Any) -> optuna.pruners.BasePruner | None:
    if pruner is None or isinstance(pruner, optuna.pruners.BasePruner):
        return pruner
    if isinstance(pruner, str) and pruner in PRUNERS:
        return PRUNERS[pruner]()
    raise ValueError(f"`pruner` is {pruner!r}, but must be None, an optuna.pruners.BasePruner or one of "
                     f"{sorted(PRUNERS)}")
