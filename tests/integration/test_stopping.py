"""Stoppers and the time budget on the real engine (`ModelSelection(stop=..., time_budget_s=...)`): each stopper
stops what it should and says why; a run whose budget is spent ends cleanly, is not finished, and resumes with a
larger budget to the end, each config's epochs trained exactly once (the schedule log says so)."""

from __future__ import annotations

import json
import os

import pytest
import torch

import automl
import framework
from framework.steering.status import run_status
from framework.stoppers import (
    ExperimentPlateauStopper,
    FunctionStopper,
    MaximumIterationStopper,
    TimeoutStopper,
    TrialPlateauStopper,
)
from framework.store.catalog import SQLiteCatalog
from simulators import validate_schedule
from tests.integration.ft_functions import classifier_eval_fn, classifier_train_fn, mlp_model_fn, slow_train_fn

pytestmark = pytest.mark.ray

SPACE = {"hidden": [16], "lr": [0.05, 0.1, 0.2], "batch_size": [64]}


@pytest.fixture(scope="module")
def tiny(digits):
    x, y = digits
    return framework.PartitionedDataset.from_arrays(x[:200], y[:200], num_partitions=2, seed=0)


def _select(ds, storage, procedure=None, train_fn=classifier_train_fn, **options):
    procedure = procedure or automl.GridSearch(SPACE, epochs=3)
    return framework.ModelSelection(mlp_model_fn, train_fn, classifier_eval_fn, ds, procedure,
                                    storage_path=str(storage), progress=False, **options)


def _events(result, kind):
    return [json.loads(d) for d in result.events[result.events.kind == kind].detail]


def _status(result):
    return result.status.set_index("config_id")


def _epochs_once(result, epochs: dict[int, int]):
    """Every config trained each of its `epochs` on both partitions exactly once (one `done` row each), and
    nothing else: the schedule log is the proof."""
    report = validate_schedule(result.schedule, partitions=[0, 1])
    assert report.ok, report.violations
    train = result.schedule[result.schedule.kind == "train"]
    assert not train.duplicated(["config_id", "epoch", "partition"]).any()
    assert sorted(train.config_id.unique()) == sorted(epochs)
    for cid, n in epochs.items():
        mine = train[train.config_id == cid]
        assert sorted(zip(mine.epoch, mine.partition)) == [(e, p) for e in range(n) for p in (0, 1)], cid
    result.assert_complete()


def _replays_identically(result):
    """The run's log replayed (`framework.replay`) gives every config the run's weights and epochs: what ran was
    logged once, in order, whatever stopped it or cut it."""
    again = framework.replay(result.storage_path)
    assert _status(again).epochs.to_dict() == _status(result).epochs.to_dict()
    for cid in result.configs:
        a, b = result.load_state(cid), again.load_state(cid)
        assert a["visited"] == b["visited"]
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), cid


def test_a_stop_dict_stops_every_config_at_its_epochs(ray_cluster, tiny, tmp_path):
    result = _select(tiny, tmp_path / "run", stop={"epochs": 2}).run()
    status = _status(result)
    assert (status.status == "stopped").all() and (status.epochs == 2).all()
    reasons = result.stop_reasons
    assert sorted(reasons.config_id) == [0, 1, 2]
    assert all(r.startswith("MaximumIterationStopper: finished 2 epochs") for r in reasons.reason)
    _epochs_once(result, {0: 2, 1: 2, 2: 2})
    assert result.ended_by is None and run_status(result.storage_path)["status"] == "finished"
    _replays_identically(result)


def test_a_function_stopper_stops_only_the_config_it_names(ray_cluster, tiny, tmp_path):
    stop = FunctionStopper(lambda cid, result: cid == 1 and result["training_iteration"] >= 1)
    result = _select(tiny, tmp_path / "run", stop=stop).run()
    status = _status(result)
    assert status.loc[1, "status"] == "stopped" and status.loc[1, "epochs"] == 1
    assert (status.loc[[0, 2], "status"] == "completed").all() and (status.loc[[0, 2], "epochs"] == 3).all()
    assert list(result.stop_reasons.config_id) == [1]
    _epochs_once(result, {0: 3, 1: 1, 2: 3})


def test_a_trial_plateau_stopper_stops_after_its_grace_period(ray_cluster, tiny, tmp_path):
    # a std far above any change of the loss: every config has plateaued once it has `num_results` epochs
    stop = TrialPlateauStopper("train_loss", std=1e6, num_results=2, grace_period=2)
    result = _select(tiny, tmp_path / "run", stop=stop).run()
    status = _status(result)
    assert (status.status == "stopped").all() and (status.epochs == 2).all()
    assert all("train_loss plateaued" in r for r in result.stop_reasons.reason)


def test_an_experiment_plateau_stopper_ends_the_run(ray_cluster, tiny, tmp_path):
    # after the first round the best 2 valid losses of 3 configs are within a huge std: the run stops there
    stop = [ExperimentPlateauStopper("valid_loss", std=1e6, top=2), MaximumIterationStopper(5)]
    result = _select(tiny, tmp_path / "run", stop=stop).run()
    status = _status(result)
    assert (status.status == "stopped").all() and (status.epochs == 1).all()
    [run_wide] = _events(result, "run_stopped")
    assert run_wide["reason"].startswith("CombinedStopper: the best 2 values of valid_loss plateaued")
    assert result.stop_reasons.config_id.isna().any()
    _epochs_once(result, {0: 1, 1: 1, 2: 1})


def test_a_stopper_on_an_asynchronous_procedure(ray_cluster, tiny, tmp_path):
    asha = automl.ASHA(SPACE, max_epochs=3, eta=3, max_configs=3, seed=0)
    result = _select(tiny, tmp_path / "run", asha, stop=MaximumIterationStopper(1)).run()
    status = _status(result)
    assert (status.epochs == 1).all()
    assert set(status.status) <= {"stopped", "pruned", "completed"} and (status.status == "stopped").any()


def test_a_spent_budget_ends_the_run_cleanly_and_a_larger_one_finishes_it(ray_cluster, tiny, tmp_path):
    """Each unit sleeps 0.2 s: 3 configs x 3 epochs x 2 partitions on 2 workers take far more than the 0.3 s budget,
    so the budget ends the first session whatever the machine's load; the units dispatched at once still finish."""
    space = {**SPACE, "sleep": [0.2]}
    storage = tmp_path / "run"
    first = _select(tiny, storage, automl.GridSearch(space, epochs=3), train_fn=slow_train_fn,
                    time_budget_s=0.3).run()
    assert first.ended_by == "time_budget_s=0.3"
    [spent] = _events(first, "time_budget_spent")
    assert spent["by"] == "time_budget_s" and spent["spent_s"] >= 0.3
    assert (first.status.status == "active").any() and len(first.schedule) >= 2  # what was in flight finished
    assert run_status(str(storage))["status"] == "budget_spent"
    with pytest.raises(ValueError, match=r"`time_budget_s` gives a budget of 0.3 s, but the run has spent"):
        framework.ModelSelection.resume(str(storage), mlp_model_fn, slow_train_fn, classifier_eval_fn)
    resumed = framework.ModelSelection.resume(str(storage), mlp_model_fn, slow_train_fn, classifier_eval_fn,
                                              progress=False, time_budget_s=600).run()
    assert resumed.ended_by is None and (resumed.status.status == "completed").all()
    assert run_status(str(storage))["status"] == "finished"
    _epochs_once(resumed, {0: 3, 1: 3, 2: 3})
    catalog = SQLiteCatalog(os.path.join(str(storage), "run.db"), readonly=True)
    try:
        units = catalog.units(status=None)
    finally:
        catalog.close()
    # nothing ran twice: the first session's units all count (their states reached the disk when the budget was
    # spent), so no row was marked lost and re-run
    assert set(units.status) == {"done"}, units.status.value_counts()
    _replays_identically(resumed)


def test_a_timeout_stopper_is_the_budget_and_a_resume_takes_a_new_one(ray_cluster, tiny, tmp_path):
    space = {**SPACE, "lr": [0.1], "sleep": [0.2]}
    storage = tmp_path / "run"
    first = _select(tiny, storage, automl.GridSearch(space, epochs=3), train_fn=slow_train_fn,
                    stop=TimeoutStopper(0.2)).run()
    assert first.ended_by == "TimeoutStopper=0.2"
    resumed = framework.ModelSelection.resume(str(storage), mlp_model_fn, slow_train_fn, classifier_eval_fn,
                                              progress=False, stop=TimeoutStopper(600)).run()
    assert resumed.ended_by is None and (resumed.status.status == "completed").all()
    _epochs_once(resumed, {0: 3})


def test_the_command_line_resumes_a_spent_run_with_a_larger_budget(ray_cluster, tiny, tmp_path, capsys):
    """`modelhopper resume RUN --time-budget-s N` is `ModelSelection.resume(..., time_budget_s=N)` for a run whose
    recorded functions import (a budget no larger than the one spent is one error line, before any work)."""
    from framework.__main__ import main as cli

    storage = str(tmp_path / "run")
    _select(tiny, storage, automl.GridSearch({**SPACE, "lr": [0.1], "sleep": [0.2]}, epochs=2),
            train_fn=slow_train_fn, time_budget_s=0.3).run()
    assert run_status(storage)["status"] == "budget_spent"
    capsys.readouterr()
    assert cli(["resume", storage, "--quiet"]) == 2
    _, err = capsys.readouterr()
    assert "`time_budget_s` gives a budget of 0.3 s, but the run has spent" in err and "Traceback" not in err, err
    assert cli(["resume", storage, "--quiet", "--time-budget-s", "600"]) == 0
    assert f"Resumed {storage}: it finished" in capsys.readouterr().out
    s = run_status(storage)
    assert s["status"] == "finished" and s["configs"] == {"completed": 1} and s["epochs_trained"] == 2
