"""The contract suite: every procedure, driven by the offline engine, obeys the rules of `automl.Procedure`."""

from __future__ import annotations

import pickle

import automl
import simulators
from automl._base import ACTIVE, STOPPED


def test_procedure_runs_to_an_end(procedure_case, objective):
    _, factory, _ = procedure_case
    run = simulators.run_procedure_offline(factory(0), objective, max_rounds=200)
    assert run.finished
    assert all(s.status == STOPPED for s in run.states)


def test_procedure_suggestions_stay_inside_the_space(procedure_case, objective):
    _, factory, space = procedure_case
    run = simulators.run_procedure_offline(factory(1), objective, max_rounds=200)
    searched = automl.SearchSpace(space)
    assert run.states
    for s in run.states:
        assert searched.contains(s.config), s.config


def test_procedure_same_seed_gives_the_same_trace(procedure_case, objective):
    _, factory, _ = procedure_case
    a = simulators.run_procedure_offline(factory(3), objective, max_rounds=200)
    b = simulators.run_procedure_offline(factory(3), objective, max_rounds=200)
    assert a.trace() == b.trace()


def test_procedure_pickles_before_and_after_steps(procedure_case, objective):
    name, factory, _ = procedure_case
    fresh = pickle.loads(pickle.dumps(factory(4)))
    whole = simulators.run_procedure_offline(fresh, objective, max_rounds=200)

    engine = simulators.OfflineEngine(factory(4), objective)
    engine.run_rounds(1)
    assert not engine.done, name
    engine.objective = None  # the objective is the test's, not the procedure's: keep it out of the pickle
    copy = pickle.loads(pickle.dumps(engine))  # the procedure mid-run, with its RNG and study
    engine.objective = copy.objective = objective
    rest_original = engine.run_rounds(200)
    rest_copy = copy.run_rounds(200)
    assert rest_copy.trace() == rest_original.trace() == whole.trace()


def test_procedure_never_reactivates_stopped_configs(procedure_case, objective):
    _, factory, _ = procedure_case
    engine = simulators.OfflineEngine(factory(5), objective)
    stopped: set[int] = set()
    while not engine.done:
        engine.train_round()
        for s in engine.states:
            if s.id in stopped:
                assert s.status == STOPPED
        stopped |= {s.id for s in engine.states if s.status == STOPPED}
        # a stopped id never appears in a later stop list (the engine would raise) nor trains again
        assert all(s.status != ACTIVE for s in engine.states if s.id in stopped)
    stops = [i for d in engine.run.decisions for i in d.stop]
    assert len(stops) == len(set(stops))


def test_procedure_survives_failing_configs(procedure_case, objective):
    _, factory, _ = procedure_case

    def flaky(config: dict, epoch: int) -> dict[str, float]:
        if config["act"] == "tanh" and epoch == 1:
            raise RuntimeError("diverged")
        return objective(config, epoch)

    run = simulators.run_procedure_offline(factory(6), flaky, max_rounds=200)
    assert run.finished
    assert all(s.status in (STOPPED, automl.FAILED) for s in run.states)


def test_procedure_ranks_by_a_bound_max_metric(procedure_case, objective):
    _, factory, _ = procedure_case
    run = simulators.run_procedure_offline(factory(7), objective, max_rounds=200, metric="valid_accuracy", mode="max")
    assert run.finished
