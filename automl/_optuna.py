"""The Optuna study behind ASHA, TPE and OptunaSearch: opened lazily, in `<storage_path>/optuna.db` when the run
has a storage directory (else in memory), named after the procedure class and seed; every epoch reported (single
objective), every end told (one value per objective). Optuna's INFO lines about the study (its creation) are kept out
of the run's output (`quiet_optuna`)."""

from __future__ import annotations

import abc
import contextlib
import math
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import optuna
from optuna.trial import TrialState

from automl._base import FAILED, PROCEDURE, STOPPED, ConfigState, Procedure, own_active
from automl._checks import check_int, json_exact
from automl.space import SearchSpace


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's INFO lines ("A new study created in memory with name: ...", "Using an existing study ...") kept out
    of the run's output while the block runs: its verbosity is at least WARNING there and is restored after it (what
    the user set for their own studies stays theirs; a user who set WARNING or less chatty sees no change)."""
    verbosity = optuna.logging.get_verbosity()
    if verbosity >= optuna.logging.WARNING:
        yield
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


class OptunaProcedure(Procedure):
    """Private base: a procedure whose configs are Optuna trials (config id -> trial)."""

    space: SearchSpace
    seed: int
    #: a define-by-run space: `fn(trial) -> config dict or None` suggests each parameter on an Optuna trial (None:
    #: the config is `trial.params`); set by OptunaSearch, None when `space` is a `SearchSpace`
    define_by_run: Callable[[optuna.Trial], dict[str, Any] | None] | None = None
    #: the pruner the study consults after every reported epoch (None: no pruning)
    pruner: optuna.pruners.BasePruner | None = None

    def __init__(self) -> None:
        self._sampler = self._make_sampler()
        self._storage_url: str | None = None
        self._study: optuna.Study | None = None
        self._trial_ids: dict[int, int] = {}  # config id -> Optuna trial id (storage key)
        self._trial_numbers: dict[int, int] = {}  # config id -> trial number
        self._reported: dict[int, int] = {}  # config id -> epochs reported so far
        self._told: set[int] = set()

    @abc.abstractmethod
    def _make_sampler(self) -> optuna.samplers.BaseSampler: ...

    @property
    def sampler_seed(self) -> int:
        """The seed handed to Optuna's sampler: the procedure's seed folded into numpy's range [0, 2**32), which
        Optuna's samplers take (every procedure accepts any int >= 0)."""
        return self.seed % (1 << 32)

    @property
    def objectives(self) -> list[tuple[str, str]]:
        """`(metric, mode)` per objective: one, unless the procedure was given lists of metrics and modes."""
        if isinstance(self.metric, (list, tuple)):
            return list(zip(self.metric, self.mode))
        return [(self.metric, self.mode)]

    @property
    def study_name(self) -> str:
        return f"{type(self).__name__}-seed{self.seed}"

    def bind(self, metric: str, mode: str, storage_path: str | None = None, *, num_workers: int | None = None) -> None:
        super().bind(metric, mode, storage_path, num_workers=num_workers)
        if storage_path is None:
            url = None
        elif "://" in storage_path and not storage_path.startswith("file://"):
            # Optuna's SQLite storage needs a local file; a remote run directory keeps the study in memory.
            warnings.warn(
                f"`storage_path` is {storage_path!r}, a remote URI: the Optuna study of {self.study_name} stays in "
                "memory (it is still saved with the pickled procedure)",
                stacklevel=2,
            )
            url = None
        else:
            local = storage_path.removeprefix("file://")
            url = "sqlite:///" + os.path.join(os.path.abspath(local), "optuna.db")
        if url != self._storage_url:
            if self._trial_ids:
                raise RuntimeError(f"`storage_path` is {storage_path!r}, but the study already has trials elsewhere")
            self._storage_url, self._study = url, None

    @property
    def study(self) -> optuna.Study:
        """The study (created on first use, or loaded when it exists: a resumed run continues it)."""
        if self._study is None:
            if self._storage_url is not None:
                os.makedirs(self._storage_url.removeprefix("sqlite:///").rsplit(os.sep, 1)[0], exist_ok=True)
            with quiet_optuna():  # (the study is the procedure's bookkeeping: no "A new study created" line)
                self._study = optuna.create_study(
                    storage=self._storage_url,
                    sampler=self._sampler,
                    pruner=self.pruner or optuna.pruners.NopPruner(),
                    study_name=self.study_name,
                    directions=["minimize" if mode == "min" else "maximize" for _, mode in self.objectives],
                    load_if_exists=True,
                )
            self._fail_orphans()
        return self._study

    def _fail_orphans(self) -> None:
        """A resumed run's study may be ahead of the procedure: the study is written as a decision is made, the run's
        catalog when the decision commits, so a driver killed in between leaves trials this procedure (restored as
        of the last commit) never asked. They end as FAIL, marked `orphan`; the decision made again asks anew."""
        mine = set(self._trial_numbers.values())
        for t in self._study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
            if t.number not in mine:
                optuna.Trial(self._study, t._trial_id).set_user_attr("orphan", True)
                self._study.tell(t.number, state=TrialState.FAIL)

    def _ended_in_study(self, config_id: int) -> bool:
        """Whether the trial of `config_id` already ended in the study: a decision the run did not commit told it
        before the driver was killed (see `_fail_orphans`); the decision made again on resume must not tell it
        twice (Optuna refuses), and what the study holds stands."""
        return self.study._storage.get_trial(self._trial_ids[config_id]).state.is_finished()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        if self._storage_url is not None:
            state["_study"] = None  # the database holds it; reopened (with the pickled sampler) on first use
        return state

    def _ask(self, config_id: int) -> dict[str, Any]:
        """A new trial for config `config_id`; returns its config."""
        if self.define_by_run is None:
            trial = self.study.ask(self.space.to_optuna())
            config = self.space.from_optuna(trial.params)
        else:
            trial = self.study.ask()
            try:
                config = self.define_by_run(trial)
            except Exception:
                self.study.tell(trial, state=TrialState.FAIL)
                raise
            config = dict(trial.params) if config is None else config
            if not isinstance(config, dict):
                self.study.tell(trial, state=TrialState.FAIL)
                raise TypeError(f"`space` ({self.define_by_run!r}) returned {config!r}, but a define-by-run space "
                                "must return a config dict or None (then the config is trial.params)")
            try:  # what a config may hold (`automl.json_exact`), checked at the draw
                config = json_exact("config", config)
            except (TypeError, ValueError) as e:
                self.study.tell(trial, state=TrialState.FAIL)
                raise type(e)(f"{e} (in the config the define-by-run `space` returned)") from None
        trial.set_user_attr("config_id", config_id)  # the engine's id: the trial's row in `Result.metrics`
        self._trial_ids[config_id] = trial._trial_id
        self._trial_numbers[config_id] = trial.number
        self._reported[config_id] = 0
        return config

    def _report(self, states: list[ConfigState]) -> None:
        """`trial.report(value, step=epoch)` for every epoch not reported yet (steps are 0-based epochs, as in
        `Result.metrics`). Optuna keeps no intermediate values for several objectives: each epoch's values are then
        a user attribute `epoch_<e>` of the trial instead."""
        multi = len(self.objectives) > 1
        for s in states:
            done = self._reported.get(s.id)
            if done is None or done >= s.epochs or s.id in self._told or s.owner != PROCEDURE:
                continue  # (a trial that ended, or that a person took over, hears of no more epochs)
            trial = optuna.Trial(self.study, self._trial_ids[s.id])
            for e in range(done, s.epochs):
                # A metric the procedure was given itself must be reported (a typo would otherwise fail every
                # trial); the run's metric is checked by the engine, and a simulated workload may report none.
                missing = [m for m, _ in self.objectives if m not in s.history[e]]
                if missing and not getattr(self, "_metric_from_bind", False):
                    raise ValueError(f"`metric` is {self.metric!r}, but config {s.id} reported only "
                                     f"{sorted(s.history[e])} at epoch {e}: {type(self).__name__} cannot rank by "
                                     f"{missing}")
                if multi:
                    trial.set_user_attr(f"epoch_{e}", {m: float(s.history[e].get(m, math.nan))
                                                       for m, _ in self.objectives})
                    continue
                value = float(s.history[e].get(self.metric, math.nan))
                if not math.isnan(value):
                    trial.report(value, step=e)
            self._reported[s.id] = s.epochs

    def _tell(self, state: ConfigState, pruned: bool) -> None:
        """End the trial of a stopped config: PRUNED (Optuna keeps its last report as value) or COMPLETE."""
        if state.id in self._told:
            return
        self._told.add(state.id)
        number = self._trial_numbers[state.id]
        if self._ended_in_study(state.id):
            return
        if pruned:
            self.study.tell(number, state=TrialState.PRUNED)
            return
        values = [state.last(metric) for metric, _ in self.objectives]
        if any(math.isnan(v) for v in values):
            self.study.tell(number, state=TrialState.FAIL)
        else:
            self.study.tell(number, values if len(values) > 1 else values[0])

    def _should_prune(self, state: ConfigState) -> bool:
        """Whether the pruner stops the config after its latest reported epoch (never without a pruner)."""
        if self.pruner is None or state.id not in self._trial_ids or not state.epochs:
            return False
        return optuna.Trial(self.study, self._trial_ids[state.id]).should_prune()

    def _tell_completed(self, states: list[ConfigState], budget: int) -> None:
        """Tell COMPLETE the trials of configs stopped by someone else (the run's stopper, a person) once they had
        trained their whole `budget`: their result is whole (the engine labels them completed too)."""
        for s in states:
            if (s.status == STOPPED and s.owner == PROCEDURE and s.epochs >= budget and s.id in self._trial_numbers
                    and s.id not in self._told):
                self._tell(s, pruned=False)

    def _tell_failed(self, states: list[ConfigState]) -> None:
        for s in states:
            if s.status == FAILED and s.id in self._trial_numbers and s.id not in self._told:
                self._told.add(s.id)
                if not self._ended_in_study(s.id):
                    self.study.tell(self._trial_numbers[s.id], state=TrialState.FAIL)

    @staticmethod
    def _active(states: list[ConfigState]) -> list[ConfigState]:
        """The ACTIVE configs the procedure decides about: its trials (not the configs a person steers)."""
        return own_active(states)

    def _extend_samples(self, attr: str, epochs: int | None, samples: int | None) -> str:
        """`samples` more trials (`attr` holds the procedure's count); the epochs of a trial are fixed once Optuna
        was told its result."""
        if epochs is not None:
            raise ValueError(f"`epochs` is {epochs!r}, but {type(self).__name__} tells each trial its result when it "
                             "ends: it can only extend `samples`")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"`samples` is {samples!r}, but must be an int >= 1")
        if getattr(self, attr) is None:
            raise ValueError(f"`samples` is {samples!r}, but {type(self).__name__} has no `{attr}` to extend")
        setattr(self, attr, check_int(attr, getattr(self, attr) + samples, 1))  # (extended, it fits an int64)
        return f"`{attr}` is now {getattr(self, attr)}"
