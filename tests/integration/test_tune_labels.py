"""Words that mean what they say: a config that trained its procedure's whole budget reads "completed" even when the
run's stopper fired at that same epoch (Ray Tune's `MaximumIterationStopper(4)` next to ASHA's `max_epochs=4`); one
the stopper stopped earlier reads "stopped". On the driver loop (`LocalBackend`'s logical clock: no Ray)."""

from __future__ import annotations

import optuna

import automl
from automl import STOPPED
from framework.callbacks import Callback
from framework.driver import Driver, MemoryRunLog
from framework.engine.local import LocalBackend
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from framework.functions import UserFunctions
from framework.options import RunOptions
from framework.stoppers import MaximumIterationStopper
from tests.framework.driver.test_driver import _entries as driver_entries

P = 2
FNS = UserFunctions(mlp_model_fn, classifier_train_fn, classifier_eval_fn)
GRID = {"lr": [0.01, 0.05, 0.1], "in_features": [8], "hidden": [8], "classes": [3], "batch_size": [16]}
SPACE = {"lr": automl.loguniform(0.01, 0.1), "in_features": 8, "hidden": 8, "classes": 3, "batch_size": 16}


class _Notices(Callback):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_notice(self, line: str) -> None:
        self.lines.append(line)


def _entries() -> dict:
    return driver_entries(P, rows=32)


def _run(procedure, stop) -> tuple[Driver, _Notices]:
    notices = _Notices()
    backend = LocalBackend(FNS, _entries(), num_threads=1, unit_time=lambda unit, worker: 1.0)
    driver = Driver(backend, procedure, MemoryRunLog(), {w: [w] for w in range(P)}, list(range(P)),
                    RunOptions(queue_depth=1, stop=stop), observers=[notices])
    assert driver.run() is True
    return driver, notices


def _outcomes(driver) -> list[tuple[str, int]]:
    return [(c.outcome, len(c.history)) for c in driver.run_state.configs]


def test_asha_configs_that_reach_max_epochs_are_completed_though_the_stopper_fired_there():
    asha = automl.ASHA(SPACE, max_epochs=4, eta=2, max_configs=4, seed=0)
    driver, notices = _run(asha, MaximumIterationStopper(4))
    outcomes = _outcomes(driver)
    assert all(c.status == STOPPED for c in driver.run_state.configs)
    assert all(o == ("completed" if n == 4 else "pruned") for o, n in outcomes), outcomes
    assert ("completed", 4) in outcomes
    # the trials of those configs are COMPLETE in the study, told their last value
    told = {t.user_attrs["config_id"]: t.state for t in asha.study.get_trials(deepcopy=False)}
    assert all(told[c.id] == optuna.trial.TrialState.COMPLETE for c in driver.run_state.configs
               if c.outcome == "completed")
    assert any(line.startswith("config ") and "completed its budget of 4 epochs (the stopper stopped it at the same "
                                              "epoch: MaximumIterationStopper: finished 4 epochs" in line
               for line in notices.lines), notices.lines


def test_a_grid_stopped_at_its_last_epoch_is_completed_and_one_stopped_before_it_is_stopped():
    driver, _ = _run(automl.GridSearch(GRID, epochs=2), MaximumIterationStopper(2))
    assert _outcomes(driver) == [("completed", 2)] * 3
    driver, _ = _run(automl.GridSearch(GRID, epochs=3), MaximumIterationStopper(2))
    assert _outcomes(driver) == [("stopped", 2)] * 3


def test_pbt_counts_a_clones_lineage_epochs_towards_its_budget():
    pbt = automl.PBT(SPACE, population=4, epochs=4, perturbation_interval=2, seed=0)
    driver, _ = _run(pbt, MaximumIterationStopper(4))
    outcomes = _outcomes(driver)
    assert {o for o, _ in outcomes} <= {"completed", "pruned"}, outcomes  # no config reads "stopped"
    assert any(c.parent is not None and c.outcome == "completed" for c in driver.run_state.configs)
