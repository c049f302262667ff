"""PBT's `hyperparam_mutations`, `resample_probability` and `perturbation_factors` (Ray Tune's names): only the
named hyper-parameters change at an exploit, each redrawn or moved as Tune does, always inside its domain; a name the
space lacks is refused, naming it; bad arguments are one clear error; without mutations nothing changes."""

from __future__ import annotations

import re

import numpy as np
import pytest

import automl
import simulators
from automl.pbt import mutate
from automl.space import SearchSpace

MUTATIONS = {"lr": automl.loguniform(1e-3, 1.0), "momentum": [0.5, 0.8, 0.9, 0.99], "width": automl.qrandint(16, 256, 16)}


def test_only_the_named_hyper_parameters_change_and_stay_in_their_domains():
    space = SearchSpace(MUTATIONS)
    rng = np.random.default_rng(0)
    config = {"lr": 0.1, "momentum": 0.9, "width": 64, "batch_size": 32, "layers": 2}
    for _ in range(200):
        out = mutate(space, config, rng, 0.25, (1.2, 0.8))
        assert {k: out[k] for k in ("batch_size", "layers")} == {"batch_size": 32, "layers": 2}
        assert all(space.domains[k].contains(out[k]) for k in MUTATIONS), out


def test_without_a_resample_numbers_move_by_a_factor_and_lists_by_one_entry():
    space = SearchSpace(MUTATIONS)
    rng = np.random.default_rng(1)
    seen_lr, seen_m = set(), set()
    for _ in range(100):
        out = mutate(space, {"lr": 0.1, "momentum": 0.8, "width": 64}, rng, 0.0, (1.2, 0.8))
        seen_lr.add(round(out["lr"], 12))
        seen_m.add(out["momentum"])
        assert out["width"] in (48, 80)  # 64 x 0.8 = 51.2 and 64 x 1.2 = 76.8, snapped to multiples of 16
    assert seen_lr == {0.08, 0.12} and seen_m == {0.5, 0.9}


def test_with_resample_probability_one_every_value_is_a_fresh_draw():
    space = SearchSpace({"momentum": [0.5, 0.8, 0.9, 0.99]})
    rng = np.random.default_rng(2)
    drawn = {mutate(space, {"momentum": 0.8}, rng, 1.0, (1.2, 0.8))["momentum"] for _ in range(200)}
    assert drawn == {0.5, 0.8, 0.9, 0.99}  # a neighbour move could never reach 0.99 from 0.8


def test_a_value_outside_its_mutation_is_redrawn():
    space = SearchSpace({"lr": automl.uniform(0.01, 0.1)})
    out = mutate(space, {"lr": 5.0}, np.random.default_rng(3), 0.0, (1.2, 0.8))
    assert 0.01 <= out["lr"] <= 0.1


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"hyperparam_mutations": {}}, "hyperparam_mutations"),
    ({"hyperparam_mutations": ["lr"]}, "hyperparam_mutations"),
    ({"hyperparam_mutations": {"lr": 0.1}}, "hyperparam_mutations['lr']"),
    ({"hyperparam_mutations": {"opt": {"lr": automl.uniform(0.1, 1)}}},
     "hyperparam_mutations['opt/lr']` names 'opt/lr', but `space` has no such hyper-parameter: it has ['lr']"),
    ({"hyperparam_mutations": {"momentum": [0.8, 0.9]}}, "hyperparam_mutations['momentum']` names 'momentum'"),
    ({"hyperparam_mutations": {"lr": lambda: 0.05}}, "hyperparam_mutations['lr']` is <function"),
    ({"resample_probability": 1.5}, "resample_probability"),
    ({"resample_probability": True}, "resample_probability"),
    ({"perturbation_factors": ()}, "perturbation_factors"),
    ({"perturbation_factors": (1.2, -1)}, "perturbation_factors"),
])
def test_bad_arguments_name_the_parameter(kwargs, named):
    with pytest.raises((TypeError, ValueError), match=re.escape(named)):
        automl.PBT({"lr": automl.uniform(0.01, 0.1)}, population=4, epochs=4, perturbation_interval=2, **kwargs)


def _objective(config, epoch):
    return {"valid_loss": abs(config["lr"] - 0.05) + 1.0 / (epoch + 1)}


def test_on_the_driver_loop_clones_differ_from_their_donor_only_in_the_mutated_names():
    space = {"lr": automl.uniform(0.01, 0.1), "wd": automl.uniform(0.0, 0.01), "batch_size": 32, "momentum": 0.9}
    pbt = automl.PBT(space, population=6, epochs=6, perturbation_interval=2, seed=0,
                     hyperparam_mutations={"lr": automl.uniform(0.01, 0.1), "momentum": [0.8, 0.9]},
                     resample_probability=0.0, perturbation_factors=(2.0, 0.5))
    run = simulators.run_procedure_offline(pbt, _objective, num_workers=3)
    assert run.finished
    first = run.decisions[0].add
    assert len(first) == 6 and all(c["momentum"] == 0.9 for c in first)  # the space's value, mutated at exploits
    clones = [(donor, config) for d in run.decisions for donor, config in d.clone]
    assert clones, "PBT never exploited"
    for donor, config in clones:
        before = run.states[donor].config
        assert config["wd"] == before["wd"] and config["batch_size"] == 32  # not mutated: copied
        assert config["lr"] in (min(before["lr"] * 2.0, 0.1), max(before["lr"] * 0.5, 0.01))
        assert config["momentum"] in (0.8, 0.9)


def test_the_same_seed_gives_the_same_run_and_no_mutations_keeps_the_old_behaviour():
    def run(**kwargs):
        pbt = automl.PBT({"lr": automl.uniform(0.01, 0.1), "momentum": [0.8, 0.9]}, population=4, epochs=4,
                         perturbation_interval=2, seed=5, **kwargs)
        return [d.clone for d in simulators.run_procedure_offline(pbt, _objective, num_workers=2).decisions]

    with_mutations = {"hyperparam_mutations": {"lr": automl.uniform(0.01, 0.1)}}
    assert run(**with_mutations) == run(**with_mutations)
    assert run() == run(resample_probability=0.25, perturbation_factors=(1.2, 0.8))  # the defaults change nothing
