"""BOHB (Ray Tune's `TuneBOHB` + `HyperBandForBOHB`): HyperBand's brackets, started as workers free up, whose configs
come from a TPE model of the largest budget with enough results. On the driver loop: the brackets fill as
HyperBand's table says, proposals come from the model once it has data and beat random draws, the seed repeats the
run and a pickle mid-run resumes it."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest

import automl
import simulators
from automl._base import ConfigState
from tests.automl.conftest import SPACE, objective, quality


def _run(seed=0, **kwargs):
    options = {"max_epochs": 9, "eta": 3, "iterations": 2, "concurrency": 2, "seed": seed, **kwargs}
    bohb = automl.BOHB(SPACE, **options)
    return bohb, simulators.run_procedure_offline(bohb, objective)


def test_with_room_for_every_bracket_it_runs_hyperband_exactly():
    hyperband = automl.HyperBand(SPACE, max_epochs=9, eta=3, iterations=2, seed=0)
    bohb = automl.BOHB(SPACE, max_epochs=9, eta=3, iterations=2, seed=0, concurrency=1000)
    a = simulators.run_procedure_offline(hyperband, objective)
    b = simulators.run_procedure_offline(bohb, objective)
    assert a.trace() == b.trace() and set(bohb.model_budget.values()) == {None}


def test_one_bracket_at_a_time_fills_each_as_the_table_says():
    bohb, run = _run(concurrency=1)
    assert run.finished
    sizes = [len(d.add) for d in run.decisions if d.add]
    assert sizes == [9, 5, 3, 9, 5, 3]  # hyperband_brackets(9, 3): n0 = 9, 5, 3, twice
    first = 0
    for size, bracket in zip(sizes, bohb.brackets):
        epochs = Counter(s.epochs for s in run.states[first:first + size])
        n = [rung.n for rung in bracket.rungs] + [0]
        assert epochs == {rung.r: n[i] - n[i + 1] for i, rung in enumerate(bracket.rungs)}
        first += size
    assert first == len(run.states)


def test_a_new_bracket_starts_only_when_fewer_configs_train_than_the_concurrency():
    bohb = automl.BOHB(SPACE, max_epochs=9, eta=3, iterations=2, concurrency=4, seed=0)
    engine = simulators.OfflineEngine(bohb, objective)
    while not engine.done:
        active_before = sum(s.status == automl.ACTIVE for s in engine.states)
        engine.train_round()
        decision = engine.run.decisions[-1]
        if decision.add and engine.run.decisions[:-1]:
            assert active_before - len(decision.stop) < 4
    assert len(bohb._members) == len(bohb.brackets)


def _state(i: int, losses: list[float]) -> ConfigState:
    return ConfigState(i, {"lr": 0.01, "momentum": 0.9, "layers": 2, "act": "relu", "batch_size": 32},
                       epochs=len(losses), history=tuple({"valid_loss": v} for v in losses))


def test_the_model_is_of_the_largest_budget_with_min_points_plus_two_results():
    bohb = automl.BOHB(SPACE, max_epochs=9, eta=3, min_points_in_model=2)
    bohb.bind("valid_loss", "min")
    assert bohb.budgets == [1, 3, 9]
    five_short = [_state(i, [1.0]) for i in range(5)]
    four_long = [_state(5 + i, [1.0, 0.9, 0.8]) for i in range(4)]
    assert bohb.model_of(five_short[:3]) is None  # 3 < 2 + 2
    assert bohb.model_of(five_short) == 1
    assert bohb.model_of(five_short + four_long) == 3  # 4 results at 3 epochs (and 9 at 1)
    assert bohb.model_of(five_short + four_long[:3]) == 1
    obs = bohb.observations(five_short + four_long)
    assert [len(obs[r]) for r in (1, 3, 9)] == [9, 4, 0] and obs[3][0][1] == pytest.approx(-0.8)


def test_min_points_default_to_the_searched_dimensions_plus_one():
    assert automl.BOHB(SPACE, max_epochs=9).min_points_in_model == 5  # lr, momentum, layers, act (+1)


def test_proposals_come_from_the_model_once_enough_results_exist():
    bohb, run = _run(concurrency=1, random_fraction=0.0)
    first_bracket = range(9)
    assert all(bohb.model_budget[i] is None for i in first_bracket)  # nothing to fit yet
    later = [bohb.model_budget[s.id] for s in run.states[9:]]
    assert later and all(b in bohb.budgets for b in later)  # random_fraction=0: every later config is modelled
    assert max(later) == 9
    never, _ = _run(concurrency=1, random_fraction=1.0)
    assert set(never.model_budget.values()) == {None}


def test_about_random_fraction_of_the_proposals_are_drawn_from_the_space():
    bohb, run = _run(concurrency=1, iterations=6, random_fraction=0.5)
    modelled = [bohb.model_budget[s.id] for s in run.states[9:]]
    share = sum(b is None for b in modelled) / len(modelled)
    assert len(modelled) > 60 and 0.35 < share < 0.65


def test_model_proposals_beat_random_draws():
    model, drawn = [], []
    for seed in range(3):
        bohb, run = _run(seed=seed, iterations=4, random_fraction=0.5)
        model += [quality(s.config) for s in run.states if bohb.model_budget[s.id] is not None]
        drawn += [quality(s.config) for s in run.states if bohb.model_budget[s.id] is None]
    assert len(model) > 30 and len(drawn) > 30
    assert np.mean(model) < 0.9 * np.mean(drawn)


def test_suggestions_lie_in_the_space_and_the_seed_repeats_the_run():
    a, run_a = _run(seed=3)
    _, run_b = _run(seed=3)
    _, run_c = _run(seed=4)
    assert run_a.trace() == run_b.trace() != run_c.trace()
    assert all(automl.SearchSpace(SPACE).contains(s.config) for s in run_a.states)
    assert any(b is not None for b in a.model_budget.values())


def test_a_pickled_bohb_resumes_where_it_stopped():
    _, whole = _run(seed=1)
    engine = simulators.OfflineEngine(automl.BOHB(SPACE, max_epochs=9, eta=3, iterations=2, concurrency=2, seed=1),
                                      objective)
    engine.run_rounds(8)
    assert not engine.done and len(engine.procedure._members) > 1
    engine.objective = None
    copy = pickle.loads(pickle.dumps(engine))
    copy.objective = objective
    assert copy.run_rounds(200).trace() == whole.trace()


def test_load_procedure_finds_bohb_by_its_short_name():
    bohb = automl.load_procedure("bohb", space=SPACE, max_epochs=3)
    assert isinstance(bohb, automl.BOHB) and isinstance(bohb, automl.HyperBand)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"random_fraction": 1.5}, ValueError, r"`random_fraction` is 1.5, but must be in \[0, 1\]"),
    ({"min_points_in_model": 0}, ValueError, r"`min_points_in_model` is 0, but must be >= 1"),
    ({"n_ei_candidates": 0}, ValueError, r"`n_ei_candidates` is 0, but must be >= 1"),
    ({"concurrency": 0}, ValueError, r"`concurrency` is 0, but must be >= 1"),
    ({"eta": 1}, ValueError, r"`eta` is 1, but must be >= 2"),
])
def test_bad_arguments_name_the_parameter(kwargs, error, message):
    with pytest.raises(error, match=message):
        automl.BOHB(SPACE, max_epochs=9, **kwargs)


def test_a_space_optuna_cannot_search_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"`space\['noise'\]` is Normal.*Optuna has no normal distribution"):
        automl.BOHB({"noise": automl.randn(0, 1)}, max_epochs=3)
