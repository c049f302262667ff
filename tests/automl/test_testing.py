from __future__ import annotations

import pytest

import automl
import simulators
from automl import Decision, Procedure


class _Scripted(Procedure):
    """Returns the given decisions in order (then empty ones)."""

    def __init__(self, decisions):
        self.decisions = list(decisions)

    def step(self, states):
        return self.decisions.pop(0) if self.decisions else Decision()


def _loss(config, epoch):
    return {"valid_loss": config["q"] / (epoch + 1)}


def test_offline_engine_assigns_ids_add_first_then_clone():
    proc = _Scripted(
        [
            Decision(add=[{"q": 1.0}, {"q": 2.0}]),
            Decision(add=[{"q": 3.0}], clone=[(1, {"q": 2.5})], stop=[0]),
            Decision(stop=[1, 2, 3]),
        ]
    )
    run = simulators.run_procedure_offline(proc, _loss)
    assert [(s.id, s.config["q"], s.parent) for s in run.states] == [
        (0, 1.0, None),
        (1, 2.0, None),
        (2, 3.0, None),
        (3, 2.5, 1),
    ]
    assert [s.epochs for s in run.states] == [1, 2, 1, 1]
    assert run.weight_epochs == {0: 1, 1: 2, 2: 1, 3: 2}  # the clone inherited 1 epoch of weights
    assert run.states[3].history[0]["valid_loss"] == 2.5 / 2  # it trained with epoch index 1
    assert run.finished and run.rounds == 2


def test_offline_engine_marks_raising_and_nan_configs_failed():
    def objective(config, epoch):
        if config["q"] == 1.0:
            raise RuntimeError("boom")
        return {"valid_loss": float("nan") if config["q"] == 2.0 else 0.1}

    proc = _Scripted([Decision(add=[{"q": 1.0}, {"q": 2.0}, {"q": 3.0}]), Decision(stop=[2])])
    run = simulators.run_procedure_offline(proc, objective)
    assert [s.status for s in run.states] == [automl.FAILED, automl.FAILED, automl.STOPPED]
    assert run.errors[0] == "RuntimeError: boom" and "NaN" in run.errors[1]


def test_offline_engine_rejects_stopping_inactive_or_unknown_ids():
    twice = _Scripted([Decision(add=[{"q": 1.0}, {"q": 2.0}]), Decision(stop=[0]), Decision(stop=[0])])
    with pytest.raises(RuntimeError, match=r"`stop` holds 0, but only ACTIVE ids can be stopped \(it is stopped\)"):
        simulators.run_procedure_offline(twice, _loss)
    unknown = _Scripted([Decision(add=[{"q": 1.0}]), Decision(stop=[5])])
    with pytest.raises(RuntimeError, match=r"`stop` holds 5, but only ACTIVE ids can be stopped \(it is unknown\)"):
        simulators.run_procedure_offline(unknown, _loss)
    with pytest.raises(RuntimeError, match=r"`clone` names the source 7"):
        simulators.run_procedure_offline(_Scripted([Decision(add=[{"q": 1.0}]), Decision(clone=[(7, {"q": 1})])]), _loss)


def test_offline_run_stops_at_max_rounds():
    proc = _Scripted([Decision(add=[{"q": 1.0}])])
    run = simulators.run_procedure_offline(proc, _loss, max_rounds=3)
    assert not run.finished and run.rounds == 3


def test_offline_run_to_frame_is_long_format(space, objective):
    run = simulators.run_procedure_offline(automl.RandomSearch(space, num_samples=2, epochs=3), objective)
    frame = run.to_frame()
    assert len(frame) == 6
    assert {"config_id", "epoch", "lr", "act", "valid_loss"} <= set(frame.columns)
