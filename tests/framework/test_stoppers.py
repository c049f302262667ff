"""Stoppers (`framework.stoppers`): each rule on hand-made histories, their validation, how a run records them, and
the time budget and stoppers on the driver loop (`LocalBackend`'s logical clock: exact, in milliseconds, no Ray)."""

from __future__ import annotations

import datetime
import json
import pickle

import pytest

import automl
from automl import ACTIVE, STOPPED, ConfigState
from framework.callbacks import Callback
from framework.driver import Driver, MemoryRunLog, SQLiteRunLog
from framework.engine.local import LocalBackend
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from framework.functions import UserFunctions
from framework.options import RunOptions
from framework.stoppers import (
    CombinedStopper,
    ExperimentPlateauStopper,
    FunctionStopper,
    MaximumIterationStopper,
    MetricThresholdStopper,
    Stopper,
    TimeoutStopper,
    TrialPlateauStopper,
    ended_by,
    make_stopper,
    stop_reasons,
    stopper_from_spec,
    stopper_spec,
)
from framework.store.catalog import SQLiteCatalog
from framework.store.checkpoint import CheckpointStore
from framework.store.signing import loads_signed
from simulators import validate_schedule
from tests.framework.driver.test_driver import _entries as driver_entries


def _state(values, metric="valid_loss", cid=0, **more) -> ConfigState:
    history = tuple({metric: v, **more} for v in values)
    return ConfigState(cid, {}, len(history), history)


# ---- each rule -----------------------------------------------------------------------------------------------------
def test_maximum_iteration_stopper_stops_at_max_iter_epochs():
    s = MaximumIterationStopper(3)
    assert s.on_epoch(_state([1.0, 0.9])) is None
    assert s.on_epoch(_state([1.0, 0.9, 0.8])) == "finished 3 epochs (max_iter=3)"
    assert s.stop_all() is None


def test_metric_threshold_stopper_reaches_from_either_side():
    up = MetricThresholdStopper("valid_acc", 0.9)
    assert up.on_epoch(_state([0.5, 0.89], "valid_acc")) is None
    assert up.on_epoch(_state([0.5, 0.9], "valid_acc")) == "valid_acc=0.9 reached 0.9 (max)"
    down = MetricThresholdStopper("valid_loss", 0.2, mode="min")
    assert down.on_epoch(_state([0.3])) is None
    assert down.on_epoch(_state([0.3, 0.15])) is not None
    assert down.on_epoch(_state([0.1], "train_loss")) is None  # a metric the config did not report stops nothing


def test_trial_plateau_stopper_waits_for_its_grace_period_and_results():
    s = TrialPlateauStopper("valid_loss", std=0.01, num_results=3, grace_period=4)
    flat = [0.5, 0.5, 0.5, 0.5]
    assert s.on_epoch(_state(flat[:3])) is None  # 3 epochs < grace period 4
    assert s.on_epoch(_state(flat)) == "valid_loss plateaued: std 0 < 0.01 over its last 3 epochs"
    # the last 3 of [0.9, 0.5, 0.52, 0.5]: population std 0.00943 < 0.01; of [0.9, 0.5, 0.53, 0.5]: 0.0141
    assert s.on_epoch(_state([0.9, 0.5, 0.52, 0.5])) is not None
    assert s.on_epoch(_state([0.9, 0.5, 0.53, 0.5])) is None


def test_trial_plateau_stopper_with_a_threshold_stops_only_good_enough_configs():
    s = TrialPlateauStopper("valid_loss", std=0.01, num_results=2, grace_period=2, metric_threshold=0.3, mode="min")
    assert s.on_epoch(_state([0.5, 0.5])) is None  # plateaued, but above the threshold
    assert s.on_epoch(_state([0.3, 0.3])) is not None
    acc = TrialPlateauStopper("valid_acc", std=0.01, num_results=2, grace_period=2, metric_threshold=0.8, mode="max")
    assert acc.on_epoch(_state([0.7, 0.7], "valid_acc")) is None
    assert acc.on_epoch(_state([0.8, 0.8], "valid_acc")) is not None


def test_experiment_plateau_stopper_counts_plateaued_epoch_ends_in_a_row():
    """top=2, std=0.05, patience=1: the best two losses must be within std 0.05 for more than one epoch end."""
    s = ExperimentPlateauStopper("valid_loss", std=0.05, top=2, mode="min", patience=1)
    trace = []
    for cid, value in [(0, 1.0), (1, 0.5), (0, 0.45), (1, 0.44), (0, 0.43)]:
        assert s.on_epoch(_state([value], cid=cid)) is None
        trace.append(s.stop_all() is not None)
    # top 2 after each: [1.0] | [0.5, 1.0] std .25 | [.45, .5] std .025 (1) | [.44, .45] (2) | [.43, .44] (3)
    assert trace == [False, False, False, True, True]
    assert "the best 2 values of valid_loss plateaued" in s.stop_all()


def test_experiment_plateau_stopper_resets_when_a_better_value_breaks_the_plateau():
    s = ExperimentPlateauStopper("valid_acc", std=0.01, top=2, mode="max", patience=0)
    for v in (0.5, 0.5):
        s.on_epoch(_state([v], "valid_acc"))
    assert s.stop_all() is not None
    s.on_epoch(_state([0.9], "valid_acc"))  # top 2: [0.9, 0.5], std 0.2
    assert s.stop_all() is None


def test_timeout_stopper_is_a_budget_in_seconds():
    assert TimeoutStopper(90).timeout_s == 90.0
    assert TimeoutStopper(datetime.timedelta(minutes=2)).timeout_s == 120.0
    assert TimeoutStopper(5).on_epoch(_state([1.0])) is None and TimeoutStopper(5).stop_all() is None


def test_function_stopper_sees_the_last_epoch_and_the_epoch_count():
    seen = []

    def fn(config_id, result):
        seen.append((config_id, result))
        return result["valid_loss"] < 0.5

    s = FunctionStopper(fn)
    assert s.on_epoch(_state([0.9], cid=4)) is None
    assert s.on_epoch(_state([0.9, 0.4], cid=4)).startswith("test_function_stopper_sees_the_last_epoch")
    assert seen[-1] == (4, {"valid_loss": 0.4, "epochs": 2, "training_iteration": 2, "config_id": 4})


def test_combined_stopper_shows_every_stopper_every_epoch_and_gives_the_first_reason():
    plateau = ExperimentPlateauStopper("valid_loss", std=1.0, top=2)
    s = CombinedStopper(MaximumIterationStopper(1), plateau, TimeoutStopper(30), TimeoutStopper(10))
    assert s.on_epoch(_state([0.5])) == "finished 1 epochs (max_iter=1)"
    assert s.on_epoch(_state([0.5], cid=1)) is not None
    assert plateau._top_values == [0.5, 0.5]  # the plateau stopper saw both epochs behind the first stopper's stop
    assert s.stop_all().startswith("the best 2 values")
    assert s.timeout_s == 10.0


# ---- `stop=` as users write it, and its validation -----------------------------------------------------------------
def test_make_stopper_reads_dicts_lists_and_functions():
    assert make_stopper(None) is None
    assert make_stopper({"epochs": 4}) == MaximumIterationStopper(4)
    assert make_stopper({"training_iteration": 4}) == MaximumIterationStopper(4)
    both = make_stopper({"epochs": 4, "valid_acc": 0.98}, metric="valid_acc", mode="max")
    assert both == CombinedStopper(MaximumIterationStopper(4), MetricThresholdStopper("valid_acc", 0.98))
    listed = make_stopper([{"epochs": 2}, TimeoutStopper(5)])
    assert isinstance(listed, CombinedStopper) and listed.timeout_s == 5.0
    assert isinstance(make_stopper(lambda cid, r: False), FunctionStopper)
    own = Stopper()
    assert make_stopper(own) is own


@pytest.mark.parametrize("stop, error, match", [
    ({}, ValueError, r"`stop` is \{\}, but a dict must hold at least one threshold"),
    ([], ValueError, r"`stop` is an empty list, but must hold at least one stopper"),
    ({"epochs": 0}, ValueError, r"`stop\['epochs'\]` is 0, but must be an int >= 1"),
    ({"epochs": 2.5}, ValueError, r"`stop\['epochs'\]` is 2.5, but must be an int >= 1"),
    ({"epoch": 3}, ValueError, r"`stop` has the key 'epoch', but epochs are numbered from 0.*'epochs'"),
    ({"accuracy": 0.9}, ValueError, r"`stop` has the key 'accuracy', but its keys must be one of"),
    ({"valid_acc": "high"}, ValueError, r"`stop\['valid_acc'\]` is 'high', but must be a finite number"),
    ({"valid_acc": float("nan")}, ValueError, r"`stop\['valid_acc'\]` is nan, but must be a finite number"),
    ({"valid_loss": 0.1}, ValueError, r"the run minimises 'valid_loss': use MetricThresholdStopper\('valid_loss'"),
    ({"valid_acc": 10**400}, ValueError, r"^`stop\['valid_acc'\]` is 1.00000e\+400 \(an int\), but must be a finite "
                                         r"number \(the threshold\)$"),
    ({"epochs": 2**70}, ValueError, r"^`stop\['epochs'\]` is 1.18059e\+21 \(an int\), but must be an int >= 1 and "
                                    r"<= 2\*\*63 - 1"),
    (3, TypeError, r"`stop` is 3, but must be a framework.stoppers.Stopper, a dict of thresholds"),
])
def test_make_stopper_rejects_what_it_cannot_read_naming_it(stop, error, match):
    with pytest.raises(error, match=match):
        make_stopper(stop, metric="valid_loss", mode="min")


@pytest.mark.parametrize("build, match", [
    (lambda: MaximumIterationStopper(0), r"MaximumIterationStopper: `max_iter` is 0, but must be an int >= 1"),
    (lambda: MaximumIterationStopper(True), r"`max_iter` is True, but must be an int >= 1"),
    (lambda: MetricThresholdStopper("acc", 1), r"MetricThresholdStopper: `metric` is 'acc', but must name"),
    (lambda: MetricThresholdStopper("valid_acc", float("inf")), r"`threshold` is inf, but must be a finite number"),
    (lambda: MetricThresholdStopper("valid_acc", 1, mode="up"), r"`mode` is 'up', but must be one of"),
    (lambda: TrialPlateauStopper("valid_loss", std=0), r"TrialPlateauStopper: `std` is 0, but must be a finite"),
    (lambda: TrialPlateauStopper("valid_loss", num_results=0), r"`num_results` is 0, but must be an int >= 1"),
    (lambda: TrialPlateauStopper("valid_loss", grace_period=-1), r"`grace_period` is -1, but must be an int >= 1"),
    (lambda: TrialPlateauStopper("valid_loss", metric_threshold=0.1), r"`mode` is None, but must be one of"),
    (lambda: TrialPlateauStopper("valid_loss", metric_threshold="x", mode="min"), r"`metric_threshold` is 'x'"),
    (lambda: ExperimentPlateauStopper("valid_loss", top=1), r"ExperimentPlateauStopper: `top` is 1, but must be"),
    (lambda: ExperimentPlateauStopper("valid_loss", std=-1.0), r"`std` is -1.0, but must be a finite number > 0"),
    (lambda: ExperimentPlateauStopper("valid_loss", patience=-1), r"`patience` is -1, but must be an int >= 0"),
    (lambda: ExperimentPlateauStopper("valid_loss", mode="lowest"), r"`mode` is 'lowest', but must be one of"),
    (lambda: TimeoutStopper(0), r"TimeoutStopper: `timeout` is 0, but must be a finite number of seconds > 0"),
    (lambda: TimeoutStopper(datetime.timedelta(0)), r"`timeout` is datetime.timedelta\(0\), but must be"),
    (lambda: CombinedStopper(), r"CombinedStopper: `stoppers` is empty"),
    # numbers no float or int64 holds: one line at construction, not an OverflowError in the run
    (lambda: TimeoutStopper(10**400), r"^TimeoutStopper: `timeout` is 1.00000e\+400 \(an int\), but must be a finite "
                                      r"number of seconds > 0 or a datetime.timedelta$"),
    (lambda: MaximumIterationStopper(2**70), r"^MaximumIterationStopper: `max_iter` is 1.18059e\+21 \(an int\), but "
                                             r"must be <= 2\*\*63 - 1"),
    (lambda: MetricThresholdStopper("valid_acc", 10**400), r"`threshold` is 1.00000e\+400 \(an int\), but must be"),
    (lambda: TrialPlateauStopper("valid_loss", std=10**400), r"`std` is 1.00000e\+400 \(an int\), but must be a"),
    (lambda: TrialPlateauStopper("valid_loss", grace_period=2**64), r"`grace_period` is 1.84467e\+19 \(an int\)"),
    (lambda: TrialPlateauStopper("valid_loss", metric_threshold=-(10**400), mode="min"),
     r"`metric_threshold` is -1.00000e\+400 \(an int\), but must be a finite number or None"),
    (lambda: ExperimentPlateauStopper("valid_loss", top=2**70), r"`top` is 1.18059e\+21 \(an int\), but must be <="),
    (lambda: ExperimentPlateauStopper("valid_loss", patience=2**70), r"`patience` is 1.18059e\+21 \(an int\)"),
])
def test_stoppers_reject_bad_arguments_naming_them(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_stoppers_reject_what_is_not_a_stopper_or_a_function():
    with pytest.raises(TypeError, match=r"FunctionStopper: `function` is 3, but must be callable"):
        FunctionStopper(3)
    with pytest.raises(TypeError, match=r"CombinedStopper: `stoppers` holds 'x', but every entry must be"):
        CombinedStopper(MaximumIterationStopper(1), "x")


@pytest.mark.parametrize("option, value, error, match", [
    ("stop", "epochs", TypeError, r"`stop` is 'epochs', but must be a framework.stoppers.Stopper"),
    ("time_budget_s", 0, ValueError, r"`time_budget_s` is 0, but must be a finite number of seconds > 0 or None"),
    ("time_budget_s", float("inf"), ValueError, r"`time_budget_s` is inf, but must be a finite number"),
    ("time_budget_s", True, ValueError, r"`time_budget_s` is True, but must be a finite number"),
    ("time_budget_s", 10**400, ValueError, r"^`time_budget_s` is 1.00000e\+400 \(an int\), but must be a finite"),
    ("unit_timeout_s", 10**400, ValueError, r"^`unit_timeout_s` is 1.00000e\+400 \(an int\), but must be a finite"),
])
def test_run_options_validate_stop_and_the_time_budget(option, value, error, match):
    with pytest.raises(error, match=match):
        RunOptions(**{option: value})


def test_model_selection_rejects_a_bad_stop_before_any_work(tmp_path):
    import numpy as np

    import framework

    x = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    dataset = framework.PartitionedDataset.from_arrays(x, (x[:, 0] > 0).astype(np.int64), num_partitions=2)
    for stop, match in (({"epoch": 2}, r"`stop` has the key 'epoch'"), ({"valid_loss": 0.2}, r"minimises")):
        with pytest.raises(ValueError, match=match):
            framework.ModelSelection(mlp_model_fn, classifier_train_fn, classifier_eval_fn, dataset,
                                     automl.GridSearch({"lr": [0.1]}, epochs=1), storage_path=str(tmp_path / "run"),
                                     stop=stop)
    with pytest.raises(ValueError, match=r"`time_budget_s` is -1, but must be a finite number of seconds > 0"):
        framework.ModelSelection(mlp_model_fn, classifier_train_fn, classifier_eval_fn, dataset,
                                 automl.GridSearch({"lr": [0.1]}, epochs=1), storage_path=str(tmp_path / "run"),
                                 time_budget_s=-1)
    assert not (tmp_path / "run").exists()


# ---- what a run records ---------------------------------------------------------------------------------------------
RECORDABLE = [
    MaximumIterationStopper(3), MetricThresholdStopper("valid_acc", 0.9),
    MetricThresholdStopper("train_loss", 0.1, "min"),
    TrialPlateauStopper("valid_loss", std=0.02, num_results=3, grace_period=5, metric_threshold=0.4, mode="min"),
    ExperimentPlateauStopper("valid_acc", std=0.01, top=3, mode="max", patience=2), TimeoutStopper(60),
    CombinedStopper(MaximumIterationStopper(2), TimeoutStopper(5)),
]


@pytest.mark.parametrize("stopper", RECORDABLE, ids=lambda s: type(s).__name__)
def test_a_recordable_stopper_round_trips_through_json_and_pickle(stopper):
    spec = json.loads(json.dumps(stopper_spec(stopper)))
    assert stopper_from_spec(spec) == stopper
    assert pickle.loads(pickle.dumps(stopper)) == stopper
    options = RunOptions(stop=stopper, time_budget_s=30)
    assert RunOptions.from_meta(json.loads(json.dumps(options.to_meta()))) == options


def test_a_function_stopper_is_not_recorded_and_a_resume_asks_for_it_again():
    meta = RunOptions(stop=FunctionStopper(print)).to_meta()
    assert meta["stop"] == {"type": "FunctionStopper", "args": None}
    with pytest.raises(ValueError, match=r"the run used the stopper 'FunctionStopper', which resume\(\) cannot "
                                         r"rebuild; pass `stop=`"):
        RunOptions.from_meta(meta)
    again = FunctionStopper(print)
    assert RunOptions.from_meta(meta, stop=again).stop is again
    assert RunOptions.from_meta(meta, time_budget_s=9, stop=None).time_budget_s == 9


def test_ended_by_and_stop_reasons_read_the_events():
    spent = json.dumps({"budget_s": 2.5, "by": "time_budget_s"})
    assert ended_by([("round_committed", "{}"), ("time_budget_spent", spent)]) == "time_budget_s=2.5"
    assert ended_by([("time_budget_spent", spent), ("resumed", "{}")]) is None  # a later session goes on
    assert ended_by([]) is None
    # a session the local service's `down` ended (the run resumes where it stopped), unless a session followed
    assert ended_by([("service_stopping", '{"reason": "down"}')]) == "service_stopping"
    assert ended_by([("service_stopping", "{}"), ("resumed", "{}")]) is None
    rows = stop_reasons([("config_stopped", json.dumps({"config_id": 2, "epochs": 3, "reason": "r"})),
                         ("run_stopped", json.dumps({"reason": "all"}))])
    assert rows == [{"config_id": 2, "epochs": 3, "reason": "r"}, {"config_id": None, "epochs": None,
                                                                    "reason": "all"}]


def test_what_is_read_from_events_survives_details_that_are_not_json_objects():
    import pandas as pd

    from framework.driver.stopping import spent_before

    assert ended_by([("time_budget_spent", "not json")]) == "time_budget_s"
    assert ended_by([("time_budget_spent", json.dumps({"by": "TimeoutStopper", "budget_s": "x"}))]) == "TimeoutStopper"
    assert stop_reasons([("config_stopped", "[1, 2]")]) == [{"config_id": None, "epochs": None, "reason": None}]
    events = pd.DataFrame({"detail": ["{", json.dumps({"total_s": 4.0}), json.dumps({"total_s": -1}),
                                      json.dumps({"total_s": True})]})
    assert spent_before(events) == 4.0
    assert spent_before(pd.DataFrame({"detail": []})) == 0.0


# ---- on the driver loop (LocalBackend: real training, a logical clock) ---------------------------------------------
P = 2
FNS = UserFunctions(mlp_model_fn, classifier_train_fn, classifier_eval_fn)
SPACE = {"lr": [0.01, 0.05, 0.1], "in_features": [8], "hidden": [8], "classes": [3], "batch_size": [16]}


def _entries() -> dict:
    return driver_entries(P, rows=32)


def _driver(procedure, log, queue_depth=1, **options) -> Driver:
    backend = LocalBackend(FNS, _entries(), num_threads=1, unit_time=lambda unit, worker: 1.0)
    return Driver(backend, procedure, log, {w: [w] for w in range(P)}, list(range(P)),
                  RunOptions(queue_depth=queue_depth, **options))


def _events(log, kind):
    return [d for k, d in log.events if k == kind]


def _trained(log) -> list[tuple[int, int, int]]:
    done = log.schedule()
    train = done[done.kind == "train"]
    assert not done.duplicated(["config_id", "epoch", "partition", "kind"]).any(), "a unit counted twice"
    assert validate_schedule(done).ok
    return sorted(zip(train.config_id, train.epoch, train.partition))


def test_stoppers_stop_configs_at_their_epoch_ends_and_the_procedure_sees_them_stopped():
    log = MemoryRunLog()
    stop = FunctionStopper(lambda cid, r: cid == 0 and r["epochs"] >= 1)
    driver = _driver(automl.GridSearch(SPACE, epochs=3), log, stop=stop)
    assert driver.run() is True
    configs = driver.run_state.configs
    assert [(c.status, c.outcome, len(c.history)) for c in configs] == [
        (STOPPED, "stopped", 1), (STOPPED, "completed", 3), (STOPPED, "completed", 3)]
    assert _trained(log) == sorted([(0, 0, p) for p in range(P)] + [(c, e, p) for c in (1, 2) for e in range(3)
                                                                    for p in range(P)])
    [stopped] = _events(log, "config_stopped")
    assert stopped["config_id"] == 0 and stopped["epochs"] == 1 and stopped["reason"].startswith("FunctionStopper:")


def test_a_run_wide_stop_stops_every_config_and_asks_the_procedure_no_more():
    log = MemoryRunLog()
    driver = _driver(automl.GridSearch(SPACE, epochs=4), log,
                     stop=ExperimentPlateauStopper("train_loss", std=1e6, top=3, patience=1))
    driver.run()
    # the third epoch end of round 0 fills the top 3: plateaued once in a row; round 1's ends make it 4 > patience 1
    assert [len(c.history) for c in driver.run_state.configs] == [2, 2, 2]
    assert all(c.status == STOPPED and c.outcome == "stopped" for c in driver.run_state.configs)
    [run_wide] = _events(log, "run_stopped")
    assert run_wide["reason"].startswith("ExperimentPlateauStopper: the best 3 values of train_loss plateaued")


def test_a_spent_budget_lets_the_units_in_flight_finish_and_dispatches_nothing_new():
    """2 workers holding up to 2 units each (one running, one queued), units of 1 s on the logical clock: round 0
    (3 configs x (2 train + 2 eval units)) commits at t=6; with a budget of 6.5 s the driver sees the clock at t=7
    (its next event), when the budget is spent; what was in flight finishes (and counts) at t=8, and nothing starts
    after t=7."""
    log = MemoryRunLog()
    driver = _driver(automl.GridSearch(SPACE, epochs=2), log, queue_depth=2, time_budget_s=6.5)
    assert driver.run() is True
    run = driver.run_state
    assert run.ending == "time_budget_s=6.5"
    done = log.schedule()
    [spent] = _events(log, "time_budget_spent")
    assert {k: spent[k] for k in ("budget_s", "by", "spent_s")} == {"budget_s": 6.5, "by": "time_budget_s",
                                                                   "spent_s": 7.0}
    assert spent["running"] >= 1 and (done.end > 7.0).sum() == spent["running"]  # in flight at t=7: finished
    assert done.start.max() == 7.0 and run.backend.now() == 8.0
    assert any(c.status == ACTIVE for c in run.configs)  # the run has not finished
    assert _events(log, "time_spent") == [{"session_s": 8.0, "total_s": 8.0}]


def test_a_budget_spent_before_the_first_decision_ends_the_run_once_that_decision_is_committed():
    """A run that committed no decision could not resume by itself (its procedure's state is saved with a commit):
    a budget of 2.5 s runs round 0 to its commit at t=6, then nothing more starts."""
    log = MemoryRunLog()
    driver = _driver(automl.GridSearch(SPACE, epochs=2), log, queue_depth=2, time_budget_s=2.5)
    assert driver.run() is True
    run = driver.run_state
    assert run.ending == "time_budget_s=2.5" and run.round == 1 and run.backend.now() == 6.0
    [spent] = _events(log, "time_budget_spent")
    assert spent["spent_s"] == 6.0 and spent["running"] == 0
    assert _trained(log) == sorted((c, 0, p) for c in range(3) for p in range(P))


def test_a_budget_spent_run_resumes_with_a_larger_budget_and_trains_each_epoch_once(tmp_path):
    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    ckpt = CheckpointStore(str(tmp_path / "checkpoints"), catalog)
    log = SQLiteRunLog(catalog, ckpt)
    # 3 configs x 2 epochs x (2 train + 2 eval units) of 1 s on 2 workers: 12 s. Round 0 (6 s) commits, round 1's
    # first units run from t=6 to 8, when the budget of 7.5 s is seen spent
    first = _driver(automl.GridSearch(SPACE, epochs=2), log, time_budget_s=7.5)
    assert first.run() is True and first.run_state.ending is not None
    ckpt.flush()
    second = _driver(loads_signed(*catalog.last_round()[1:]), log, time_budget_s=8)  # 8 s were spent: no time left
    assert second.run(resume_from=catalog) is True and second.run_state.ending == "time_budget_s=8"
    assert second.run_state.backend.now() == 0.0
    third = _driver(loads_signed(*catalog.last_round()[1:]), log, time_budget_s=100)
    assert third.run(resume_from=catalog) is True and third.run_state.ending is None
    assert all(c.status == STOPPED and len(c.history) == 2 for c in third.run_state.configs)
    units = catalog.units(status=None)
    assert set(units.status) == {"done"}  # nothing was lost and run again
    train = units[units.kind == "train"]
    assert sorted(zip(train.config_id, train.epoch, train.partition)) == [
        (c, e, p) for c in range(3) for e in range(2) for p in range(P)]
    totals = [json.loads(d)["total_s"] for d in catalog.events("time_spent").detail]
    assert totals == [8.0, 8.0, 12.0]
    ckpt.close()
    catalog.close()


def test_a_resumed_run_rebuilds_its_stoppers_state_from_the_committed_epochs(tmp_path):
    """An experiment plateau that needs 4 epoch ends in a row: a run cut by its budget after round 0 (3 ends) stops
    where an uncut run stops, because the resumed stopper saw round 0's epochs again."""
    def stopper():
        return ExperimentPlateauStopper("train_loss", std=1e6, top=2, patience=3)

    uncut = _driver(automl.GridSearch(SPACE, epochs=5), MemoryRunLog(), stop=stopper())
    uncut.run()
    expected = [len(c.history) for c in uncut.run_state.configs]
    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    ckpt = CheckpointStore(str(tmp_path / "checkpoints"), catalog)
    log = SQLiteRunLog(catalog, ckpt)
    first = _driver(automl.GridSearch(SPACE, epochs=5), log, stop=stopper(), time_budget_s=6.5)
    first.run()
    ckpt.flush()
    assert [len(c.history) for c in first.run_state.configs] == [1, 1, 1]
    resumed = _driver(loads_signed(*catalog.last_round()[1:]), log, stop=stopper(), time_budget_s=100)
    resumed.run(resume_from=catalog)
    assert [len(c.history) for c in resumed.run_state.configs] == expected == [2, 2, 2]
    ckpt.close()
    catalog.close()


def test_an_asynchronous_run_cut_by_its_budget_resumes_to_the_end(tmp_path):
    """ASHA decides at each epoch end: what its budget cut (configs in the middle of an epoch, queued units) resumes
    with nothing lost and nothing run twice."""
    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    ckpt = CheckpointStore(str(tmp_path / "checkpoints"), catalog)
    log = SQLiteRunLog(catalog, ckpt)
    asha = automl.ASHA(SPACE, max_epochs=3, eta=3, max_configs=4, seed=0)
    first = _driver(asha, log, queue_depth=2, time_budget_s=5.5, storage_path=str(tmp_path))
    assert first.run() is True and first.run_state.ending == "time_budget_s=5.5"
    assert any(c.status == ACTIVE for c in first.run_state.configs)
    ckpt.flush()
    resumed = _driver(loads_signed(*catalog.last_round()[1:]), log, queue_depth=2, time_budget_s=1000,
                      storage_path=str(tmp_path))
    assert resumed.run(resume_from=catalog) is True and resumed.run_state.ending is None
    assert all(c.status == STOPPED for c in resumed.run_state.configs)
    units = catalog.units(status=None)
    assert set(units.status) == {"done"} and not units.duplicated(["config_id", "epoch", "partition", "kind"]).any()
    epochs = {c.id: len(c.history) for c in resumed.run_state.configs}
    train = units[units.kind == "train"]
    assert sorted(zip(train.config_id, train.epoch, train.partition)) == [
        (c, e, p) for c in sorted(epochs) for e in range(epochs[c]) for p in range(P)]
    ckpt.close()
    catalog.close()


def test_a_run_whose_last_configs_stop_while_their_units_wait_ends_instead_of_waiting_for_holders():
    """Stops that leave nothing to run and nothing running (every config stopped by a person, or by a replay
    repeating a stopper's stops, right as their next epoch opened) end the run: no worker is waited for."""
    from framework.driver.commands import Command, CommandSource

    class StopAllAfterRoundZero(CommandSource):
        def __init__(self) -> None:
            self.run, self.sent = None, False

        def poll(self):
            if self.sent or self.run is None or self.run.round < 1:
                return []
            self.sent = True
            return [Command("stop_config", {"config_id": c.id}) for c in self.run.configs.active()]

    source = StopAllAfterRoundZero()
    backend = LocalBackend(FNS, _entries(), num_threads=1, unit_time=lambda unit, worker: 1.0)
    driver = Driver(backend, automl.GridSearch(SPACE, epochs=3), MemoryRunLog(), {w: [w] for w in range(P)},
                    list(range(P)), RunOptions(queue_depth=1), commands=source)
    source.run = driver.run_state
    assert driver.run() is True
    assert [(c.status, c.outcome, len(c.history)) for c in driver.run_state.configs] == [(STOPPED, "stopped", 1)] * 3


# ---- a stopper that raises ------------------------------------------------------------------------------------------
def divides_by_zero_after_epoch_one(config_id: int, result: dict) -> bool:
    """A user's stop rule with a bug: it raises once config 1 finished its first epoch."""
    return config_id == 1 and result["epochs"] >= 1 and 1 / 0 > 0


class Unready(Stopper):
    """A user's run-wide rule that raises at its first `stop_all` after four epoch ends."""

    def __init__(self) -> None:
        self.seen = 0

    def on_epoch(self, state):
        self.seen += 1

    def stop_all(self):
        if self.seen >= 4:
            raise KeyError("valid_f1")
        return None


class _Notices(Callback):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_notice(self, line: str) -> None:
        self.lines.append(line)


def _failing_run(stop, log=None, **options) -> tuple[Driver, _Notices]:
    notices = _Notices()
    backend = LocalBackend(FNS, _entries(), num_threads=1, unit_time=lambda unit, worker: 1.0)
    driver = Driver(backend, automl.GridSearch(SPACE, epochs=3), log if log is not None else MemoryRunLog(),
                    {w: [w] for w in range(P)}, list(range(P)), RunOptions(queue_depth=1, stop=stop, **options),
                    observers=[notices])
    return driver, notices


@pytest.mark.parametrize("stop, named, error, epochs", [
    # in `on_epoch` at round 0's decision; in `stop_all` (of one of several: that one is named) at round 1's
    (FunctionStopper(divides_by_zero_after_epoch_one), "FunctionStopper(divides_by_zero_after_epoch_one)",
     "ZeroDivisionError: division by zero", 1),
    (CombinedStopper(MaximumIterationStopper(3), Unready()), "Unready(...)", "KeyError: 'valid_f1'", 2),
])
def test_a_stopper_that_raises_ends_the_run_in_one_line_with_its_traceback_in_the_events(capfd, stop, named, error,
                                                                                       epochs):
    log = MemoryRunLog()
    driver, notices = _failing_run(stop, log)
    assert driver.run() is True  # the run ends as a run-wide stop does: not crashed
    configs = driver.run_state.configs
    assert [(c.status, c.outcome, len(c.history)) for c in configs] == [(STOPPED, "stopped", epochs)] * 3
    [failed] = _events(log, "stopper_failed")
    assert failed["stopper"] == named and failed["error"] == error
    assert failed["traceback"].startswith("Traceback") and error in failed["traceback"]
    [run_wide] = _events(log, "run_stopped")
    assert run_wide["reason"] == f"the stopper failed: {named} raised {error}"
    [line] = [n for n in notices.lines if "stopper" in n]
    assert line == (f"the run stops: the stopper failed: {named} raised {error} (its traceback is in the run's "
                    "events: stopper_failed)")
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_a_run_whose_stopper_failed_records_it_so_that_a_resume_needs_no_stop():
    from framework.driver.stopping import failed_meta

    driver, _ = _failing_run(FunctionStopper(divides_by_zero_after_epoch_one))
    ok, _ = _failing_run(FunctionStopper(print))
    driver.run()
    assert failed_meta(ok.run_state) == {}
    meta = {**driver.run_state.options.to_meta(), **failed_meta(driver.run_state)}
    assert meta["stop"] == {"type": "FunctionStopper", "args": None, "failed": (
        "the stopper failed: FunctionStopper(divides_by_zero_after_epoch_one) raised ZeroDivisionError: division by "
        "zero")}
    recorded = json.loads(json.dumps(meta))
    assert RunOptions.from_meta(recorded).stop is None  # no `stop=` asked for
    again = MaximumIterationStopper(2)
    assert RunOptions.from_meta(recorded, stop=again).stop is again  # or another, given


def test_a_stopper_that_raises_when_a_resume_shows_it_the_committed_epochs_ends_the_resumed_run(tmp_path):
    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    ckpt = CheckpointStore(str(tmp_path / "checkpoints"), catalog)
    log = SQLiteRunLog(catalog, ckpt)
    first, _ = _failing_run(None, log, time_budget_s=6.5)  # round 0 commits at t=6: every config has one epoch
    first.run()
    ckpt.flush()
    backend = LocalBackend(FNS, _entries(), num_threads=1, unit_time=lambda unit, worker: 1.0)
    resumed = Driver(backend, loads_signed(*catalog.last_round()[1:]), log, {w: [w] for w in range(P)},
                     list(range(P)), RunOptions(queue_depth=1, stop=FunctionStopper(divides_by_zero_after_epoch_one)))
    assert resumed.run(resume_from=catalog) is True
    assert all(c.status == STOPPED and c.outcome == "stopped" for c in resumed.run_state.configs)
    assert [len(c.history) for c in resumed.run_state.configs] == [2, 2, 2]  # the epochs in flight finished
    kinds = list(catalog.events().kind)
    assert kinds.count("stopper_failed") == 1 and kinds.index("stopper_failed") < kinds.index("run_stopped")
    ckpt.close()
    catalog.close()
