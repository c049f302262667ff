from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

import automl
import simulators


def test_tpe_runs_in_batches_of_concurrency(space, objective):
    run = simulators.run_procedure_offline(automl.TPE(space, num_samples=7, epochs=2, concurrency=3), objective)
    assert [len(d.add) for d in run.decisions] == [3, 0, 3, 0, 1, 0, 0]
    assert [d.stop for d in run.decisions] == [[], [], [0, 1, 2], [], [3, 4, 5], [], [6]]
    assert all(s.epochs == 2 for s in run.states)


def test_tpe_concurrency_defaults_to_the_num_workers_hint(space):
    tpe = automl.TPE(space, num_samples=10, epochs=1)
    tpe.bind("valid_loss", "min", None, num_workers=5)
    assert len(tpe.step([]).add) == 5
    assert len(automl.TPE(space, num_samples=10, epochs=1).step([]).add) == 4
    explicit = automl.TPE(space, num_samples=10, epochs=1, concurrency=2)
    explicit.bind("valid_loss", "min", None, num_workers=5)
    assert len(explicit.step([]).add) == 2


def test_tpe_tells_the_final_metric(space, objective, quality):
    tpe = automl.TPE(space, num_samples=4, epochs=3, concurrency=2, seed=1)
    run = simulators.run_procedure_offline(tpe, objective)
    trials = tpe.study.trials
    assert isinstance(tpe.study.sampler, optuna.samplers.TPESampler)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert [t.value for t in trials] == pytest.approx([quality(s.config) / 3 for s in run.states])
    assert sorted(trials[0].intermediate_values) == [0, 1, 2]  # 0-based epochs, as in Result.metrics


def test_tpe_maximises_when_bound_with_max(space, objective):
    tpe = automl.TPE(space, num_samples=2, epochs=1, concurrency=2)
    simulators.run_procedure_offline(tpe, objective, metric="valid_accuracy", mode="max")
    assert tpe.study.direction == optuna.study.StudyDirection.MAXIMIZE


def test_tpe_tells_failed_configs_fail(space, objective):
    def failing(config: dict, epoch: int) -> dict[str, float]:
        if config["act"] == "relu":
            raise ValueError("boom")
        return objective(config, epoch)

    tpe = automl.TPE(space, num_samples=6, epochs=2, concurrency=3, seed=0)
    run = simulators.run_procedure_offline(tpe, failing)
    failed = {s.id for s in run.states if s.status == automl.FAILED}
    assert failed
    assert {i for i, t in enumerate(tpe.study.trials) if t.state == TrialState.FAIL} == failed
    assert len(run.states) == 6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_samples": 0}, r"`num_samples` is 0, but must be >= 1"),
        ({"epochs": 0}, r"`epochs` is 0, but must be >= 1"),
        ({"concurrency": 0}, r"`concurrency` is 0, but must be >= 1"),
        ({"seed": -1}, r"`seed` is -1, but must be an int >= 0"),
    ],
)
def test_tpe_rejects_bad_arguments(space, kwargs, message):
    with pytest.raises(ValueError, match=message):
        automl.TPE(space, **{"num_samples": 4, "epochs": 2, **kwargs})


def test_tpe_rejects_unknown_options(space):
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_startup_trials'"):
        automl.TPE(space, num_samples=4, epochs=2, n_startup_trials=3)
