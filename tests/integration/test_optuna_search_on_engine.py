"""OptunaSearch on the real engine: CMA-ES, a define-by-run conditional space and NSGA-II with two objectives each run
end to end, and Optuna's own reader (what optuna-dashboard uses) sees every trial in the run's optuna.db."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

import automl
import framework
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from simulators import validate_schedule

pytestmark = pytest.mark.ray


def conditional(trial: optuna.Trial) -> dict:
    """Wide nets get a smaller learning-rate range than narrow ones (a parameter that depends on another)."""
    hidden = trial.suggest_categorical("hidden", [16, 64])
    hi = 0.3 if hidden == 16 else 0.1
    return {"hidden": hidden, "lr": trial.suggest_float(f"lr_{hidden}", 0.01, hi, log=True), "batch_size": 64}


CASES = {
    "cmaes": lambda: automl.OptunaSearch({"hidden": 32, "lr": automl.loguniform(0.01, 0.3), "batch_size": 64},
                                         num_samples=4, epochs=2, sampler="cmaes", concurrency=2, seed=0),
    "define_by_run": lambda: automl.OptunaSearch(conditional, num_samples=4, epochs=2, concurrency=2, seed=0,
                                                 points_to_evaluate=[{"hidden": 64, "lr_64": 0.05}]),
    "nsga2": lambda: automl.OptunaSearch({"hidden": [16, 32], "lr": automl.loguniform(0.01, 0.3), "batch_size": 64},
                                         num_samples=4, epochs=2, metric=["valid_loss", "train_loss"],
                                         mode=["min", "min"], concurrency=2, seed=0),
}


@pytest.fixture(scope="module")
def small_digits(digits):
    x, y = digits
    return framework.PartitionedDataset.from_arrays(x[:600], y[:600], num_partitions=2, seed=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_optuna_search_runs_on_the_engine(name, ray_cluster, small_digits, tmp_path, assert_complete):
    search = CASES[name]()
    result = framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, small_digits, search,
        storage_path=str(tmp_path / name), progress=False, seed=0,
    ).run()
    assert validate_schedule(result.schedule, availability={0: [0], 1: [1]}, partitions=[0, 1]).ok
    assert len(result.configs) == 4 and (result.status.status == "completed").all()
    assert_complete(result)

    study = optuna.load_study(study_name=search.study_name, storage=f"sqlite:///{tmp_path / name / 'optuna.db'}")
    trials = {t.user_attrs["config_id"]: t for t in study.trials}
    assert sorted(trials) == sorted(result.configs)
    assert {t.state for t in trials.values()} == {TrialState.COMPLETE}
    metrics = result.metrics.set_index(["config_id", "epoch"])
    for cid, t in trials.items():
        if name == "nsga2":
            assert t.values == pytest.approx([metrics.loc[(cid, 1), m] for m in ("valid_loss", "train_loss")])
            assert t.user_attrs["epoch_0"]["valid_loss"] == pytest.approx(metrics.loc[(cid, 0), "valid_loss"])
        else:
            assert t.intermediate_values == pytest.approx({e: metrics.loc[(cid, e), "valid_loss"] for e in (0, 1)})
    if name == "define_by_run":
        assert result.configs[0] == {"hidden": 64, "lr": 0.05, "batch_size": 64}  # the point to evaluate first
        for cfg in result.configs.values():
            assert cfg["lr"] <= (0.3 if cfg["hidden"] == 16 else 0.1)
    if name == "nsga2":
        front = result.get_best_results(["valid_loss", "train_loss"], ["min", "min"])
        assert {r.config_id for r in front} == {t.user_attrs["config_id"] for t in study.best_trials}
