"""OptunaSearch: any sampler and pruner, configs to try first, define-by-run spaces and several objectives, driven
by the offline runner (the engine's driver loop without Ray)."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState

import automl
import simulators

FLOATS = {"lr": automl.loguniform(1e-4, 1e-1), "momentum": automl.uniform(0.5, 0.99), "batch_size": 32}


def conditional(trial: optuna.Trial) -> dict:
    """A conditional space: momentum exists only for SGD, beta2 only for Adam."""
    opt = trial.suggest_categorical("optimizer", ["sgd", "adam"])
    config = {"optimizer": opt, "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True), "act": "relu"}
    if opt == "sgd":
        config["momentum"] = trial.suggest_float("momentum", 0.5, 0.99)
    else:
        config["beta2"] = trial.suggest_float("beta2", 0.9, 0.999)
    return config


def smooth(config: dict, epoch: int) -> dict[str, float]:
    """The shared synthetic objective for configs without the `act`/`layers` keys."""
    from tests.automl.conftest import objective

    return objective({"act": "relu", "layers": 2, **config}, epoch)


def two_objectives(config: dict, epoch: int) -> dict[str, float]:
    """valid_loss falls with lr near 1e-2; train_time grows with lr: a real trade-off."""
    loss = abs(math.log10(config["lr"]) + 2.0) / (epoch + 1) + 0.01
    return {"train_loss": loss, "valid_loss": loss, "valid_time": 1.0 + math.log10(config["lr"]) + 4.0}


def test_cmaes_runs_and_tells_every_trial():
    search = automl.OptunaSearch(FLOATS, num_samples=8, epochs=2, sampler="cmaes", concurrency=2, seed=3)
    run = simulators.run_procedure_offline(search, smooth)
    assert isinstance(search.study.sampler, optuna.samplers.CmaEsSampler)
    assert len(run.states) == 8 and all(s.epochs == 2 for s in run.states)
    assert [t.state for t in search.study.trials] == [TrialState.COMPLETE] * 8
    assert all(automl.SearchSpace(FLOATS).contains(s.config) for s in run.states)
    assert [t.user_attrs["config_id"] for t in search.study.trials] == list(range(8))


def test_any_sampler_instance_is_used_as_given():
    sampler = optuna.samplers.QMCSampler(seed=1, warn_independent_sampling=False)
    search = automl.OptunaSearch(FLOATS, num_samples=4, epochs=1, sampler=sampler)
    simulators.run_procedure_offline(search, smooth)
    assert search.study.sampler is search._sampler
    assert isinstance(search.study.sampler, optuna.samplers.QMCSampler)


def test_define_by_run_space_gives_conditional_configs():
    search = automl.OptunaSearch(conditional, num_samples=10, epochs=1, sampler="random", seed=0)
    run = simulators.run_procedure_offline(search, smooth)
    kinds = {s.config["optimizer"] for s in run.states}
    assert kinds == {"sgd", "adam"}
    for s in run.states:
        assert ("momentum" in s.config) == (s.config["optimizer"] == "sgd")
        assert ("beta2" in s.config) == (s.config["optimizer"] == "adam")
        assert s.config["act"] == "relu"  # constants come from the function's return value
    trials = search.study.trials
    assert all(set(t.params) == set(s.config) - {"act"} for t, s in zip(trials, run.states))


def test_define_by_run_returning_none_uses_the_trial_params():
    def only_params(trial):
        trial.suggest_float("lr", 1e-3, 1e-1, log=True)
        trial.suggest_categorical("act", ["relu", "tanh"])

    run = simulators.run_procedure_offline(
        automl.OptunaSearch(only_params, num_samples=3, epochs=1), smooth)
    assert all(set(s.config) == {"lr", "act"} for s in run.states)


def test_define_by_run_must_return_a_dict():
    search = automl.OptunaSearch(lambda trial: [trial.suggest_float("lr", 0.1, 1.0)], num_samples=2, epochs=1)
    with pytest.raises(TypeError, match=r"must return a config dict or None"):
        search.step([])
    assert [t.state for t in search.study.trials] == [TrialState.FAIL]


def test_points_to_evaluate_come_first_and_count_towards_num_samples():
    space = {"lr": automl.loguniform(1e-4, 1e-1), "act": ["relu", "tanh", "gelu"], "shape": [(1, 2), (3, 4)]}
    first = [{"lr": 0.01, "act": "tanh", "shape": (3, 4)}, {"lr": 0.001, "act": "gelu", "shape": (1, 2)}]
    search = automl.OptunaSearch(space, num_samples=5, epochs=1, points_to_evaluate=first, concurrency=1, seed=0)
    run = simulators.run_procedure_offline(search, smooth)
    # a tuple is held as a list (JSON has no tuple: `automl.json_exact`), in the run as on its replay
    assert [s.config for s in run.states[:2]] == [{**p, "shape": list(p["shape"])} for p in first]
    assert len(run.states) == 5
    assert search.study.trials[1].params == {"lr": 0.001, "act": "gelu", "shape": 0}  # tuples by index


def test_points_to_evaluate_with_a_define_by_run_space():
    search = automl.OptunaSearch(conditional, num_samples=3, epochs=1, concurrency=1,
                                 points_to_evaluate=[{"optimizer": "adam", "lr": 0.003, "beta2": 0.95}])
    run = simulators.run_procedure_offline(search, smooth)
    assert run.states[0].config == {"optimizer": "adam", "lr": 0.003, "act": "relu", "beta2": 0.95}


def test_median_pruner_stops_bad_configs_early():
    search = automl.OptunaSearch(FLOATS, num_samples=12, epochs=6, pruner="median", sampler="random",
                                 concurrency=3, seed=0)
    run = simulators.run_procedure_offline(search, smooth)
    pruned = [s for s in run.states if s.epochs < 6]
    assert pruned, "the median pruner stopped nothing"
    states = {t.user_attrs["config_id"]: t.state for t in search.study.trials}
    assert {states[s.id] for s in pruned} == {TrialState.PRUNED}
    assert {d for dec in run.decisions for d in dec.pruned} == {s.id for s in pruned}
    assert all(len(t.intermediate_values) == run.states[t.user_attrs["config_id"]].epochs
               for t in search.study.trials)


def test_nsga2_optimises_two_objectives():
    search = automl.OptunaSearch(FLOATS, num_samples=8, epochs=2, metric=["valid_loss", "valid_time"],
                                 mode=["min", "min"], seed=0)
    run = simulators.run_procedure_offline(search, two_objectives, metric="valid_accuracy", mode="max")
    assert search.metric == ["valid_loss", "valid_time"]  # its own objectives, not the run's metric
    assert isinstance(search.study.sampler, optuna.samplers.NSGAIISampler)
    trials = search.study.trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 8
    for t in trials:
        s = run.states[t.user_attrs["config_id"]]
        assert t.values == pytest.approx([s.last("valid_loss"), s.last("valid_time")])
        assert set(t.user_attrs) == {"config_id", "epoch_0", "epoch_1"}
    assert search.study.best_trials  # Optuna's own Pareto front


def test_tpe_is_a_preset_of_optuna_search(space, objective):
    a = simulators.run_procedure_offline(automl.TPE(space, num_samples=5, epochs=1, concurrency=2, seed=4), objective)
    b = simulators.run_procedure_offline(
        automl.OptunaSearch(space, num_samples=5, epochs=1, sampler="tpe", concurrency=2, seed=4), objective)
    assert [s.config for s in a.states] == [s.config for s in b.states]


def test_optuna_is_a_procedure_name():
    search = automl.load_procedure("optuna", space=FLOATS, num_samples=2, epochs=1, sampler="gp")
    assert isinstance(search, automl.OptunaSearch)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"sampler": "annealing"}, ValueError, r"`sampler` is 'annealing', but must be None, an optuna"),
        ({"pruner": "early"}, ValueError, r"`pruner` is 'early', but must be None"),
        ({"metric": ["valid_loss", "valid_time"], "mode": "min"}, ValueError, r"`mode` is 'min', but `metric` is a "
         r"list of 2"),
        ({"metric": ["valid_loss", "valid_time"], "mode": ["min", "up"]}, ValueError, r"'up' is not"),
        ({"metric": "valid_loss"}, ValueError, r"`mode` is None, but `metric` is 'valid_loss'"),
        ({"mode": "max"}, ValueError, r"`mode` is 'max', but `metric` is None"),
        ({"metric": ["valid_loss", "valid_time"], "mode": ["min", "min"], "pruner": "median"}, ValueError,
         r"Optuna prunes one objective"),
        ({"points_to_evaluate": {"lr": 0.1}}, TypeError, r"must be a list of config dicts"),
        ({"points_to_evaluate": [{"lr": 5.0, "momentum": 0.9, "batch_size": 32}]}, ValueError,
         r"`points_to_evaluate\[0\]` is .*must lie in the space"),
        ({"points_to_evaluate": [{"lr": 0.01, "momentum": 0.9, "batch_size": 32}] * 3}, ValueError,
         r"holds 3 configs, but `num_samples` is 2"),
        ({"num_samples": 0}, ValueError, r"`num_samples` is 0, but must be >= 1"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, error, message):
    with pytest.raises(error, match=message):
        automl.OptunaSearch(FLOATS, **{"num_samples": 2, "epochs": 1, **kwargs})


def test_a_metric_nobody_reports_stops_the_search_naming_it():
    search = automl.OptunaSearch(FLOATS, num_samples=2, epochs=1, metric=["valid_loss", "valid_tim"],
                                 mode=["min", "min"])
    with pytest.raises(ValueError, match=r"reported only \['train_loss', 'valid_loss', 'valid_time'\] at epoch 0"):
        simulators.run_procedure_offline(search, two_objectives)
