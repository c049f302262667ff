from __future__ import annotations

import numpy as np
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

import automl
from automl.space import Categorical, Constant


def test_space_sampling_stays_inside_every_domain(space):
    searched = automl.SearchSpace(space)
    rng = np.random.default_rng(0)
    configs = [searched.sample(rng) for _ in range(300)]
    assert all(searched.contains(c) for c in configs)
    assert {c["act"] for c in configs} == {"relu", "tanh", "gelu"}
    assert all(c["batch_size"] == 32 for c in configs)
    assert list(configs[0]) == list(space)  # the space's key order


def test_space_randint_includes_hi():
    rng = np.random.default_rng(0)
    values = {automl.randint(1, 3).sample(rng) for _ in range(200)}
    assert values == {1, 2, 3}
    assert automl.randint(2, 2).sample(rng) == 2


def test_space_loguniform_samples_cover_decades():
    rng = np.random.default_rng(0)
    values = np.array([automl.loguniform(1e-4, 1.0).sample(rng) for _ in range(400)])
    assert values.min() >= 1e-4 and values.max() <= 1.0
    assert (values < 1e-3).mean() > 0.15  # uniform in log: about a quarter below 1e-3


def test_space_same_seed_same_samples(space):
    a = automl.SearchSpace(space).sample(np.random.default_rng(7))
    b = automl.SearchSpace(space).sample(np.random.default_rng(7))
    assert a == b


def test_space_converts_to_optuna_distributions(space):
    dists = automl.SearchSpace(space).to_optuna()
    assert dists == {
        "lr": FloatDistribution(1e-4, 1e-1, log=True),
        "momentum": FloatDistribution(0.5, 0.99),
        "layers": IntDistribution(1, 4),
        "act": CategoricalDistribution(("relu", "tanh", "gelu")),
    }


def test_space_from_optuna_adds_constants_and_decodes_choices():
    searched = automl.SearchSpace({"shape": [(3, 3), (5, 5)], "act": ["relu"], "seed": 1})
    dists = searched.to_optuna()
    assert dists["shape"] == CategoricalDistribution((0, 1))  # tuples are not Optuna choices: encoded by index
    # (a tuple is held as a list: JSON has no tuple, and a config is what the run records)
    assert searched.from_optuna({"shape": 1, "act": "relu"}) == {"shape": [5, 5], "act": "relu", "seed": 1}


def test_space_contains_rejects_missing_extra_and_outside_values(space):
    searched = automl.SearchSpace(space)
    ok = searched.sample(np.random.default_rng(0))
    assert searched.contains(ok)
    assert not searched.contains({**ok, "lr": 1.0})
    assert not searched.contains({**ok, "layers": 5})
    assert not searched.contains({**ok, "act": "sigmoid"})
    assert not searched.contains({**ok, "batch_size": 64})
    assert not searched.contains({**ok, "extra": 1})
    assert not searched.contains({k: v for k, v in ok.items() if k != "lr"})


def test_space_lists_are_categorical_and_others_constant():
    searched = automl.SearchSpace({"a": [1, 2], "b": (1, 2), "c": "x"})
    assert searched.domains == {"a": Categorical((1, 2)), "b": Constant([1, 2]), "c": Constant("x")}


def test_space_clip_keeps_values_in_range():
    assert automl.uniform(0.0, 1.0).clip(1.3) == 1.0
    assert automl.loguniform(1e-3, 1e-1).clip(1e-5) == 1e-3
    assert automl.randint(1, 4).clip(4.6) == 4
    assert automl.randint(1, 4).clip(0.2) == 1


def test_uniform_rejects_lo_not_below_hi():
    with pytest.raises(ValueError, match=r"`lo` is 5, but must be < `hi` \(3\)"):
        automl.uniform(5, 3)


def test_uniform_rejects_non_numbers():
    with pytest.raises(TypeError, match=r"`hi` is 'x', but must be a finite real number"):
        automl.uniform(0, "x")


def test_uniform_rejects_infinite_bounds():
    with pytest.raises(ValueError, match=r"`hi` is inf, but must be a finite real number"):
        automl.uniform(0, float("inf"))


def test_loguniform_rejects_non_positive_lo():
    with pytest.raises(ValueError, match=r"`lo` is 0, but must be > 0"):
        automl.loguniform(0, 1)


def test_loguniform_rejects_lo_not_below_hi():
    with pytest.raises(ValueError, match=r"`lo` is 0.1, but must be < `hi` \(0.01\)"):
        automl.loguniform(0.1, 0.01)


def test_randint_rejects_lo_above_hi():
    with pytest.raises(ValueError, match=r"`lo` is 5, but must be <= `hi` \(3\); `hi` is inclusive"):
        automl.randint(5, 3)


def test_randint_rejects_floats():
    with pytest.raises(TypeError, match=r"`lo` is 1.5, but must be an int"):
        automl.randint(1.5, 3)


def test_space_rejects_empty_list():
    with pytest.raises(ValueError, match=r"`space\['act'\]` is \[\], but a categorical list must hold"):
        automl.SearchSpace({"act": []})


def test_space_rejects_empty_or_non_dict():
    with pytest.raises(ValueError, match=r"`space` is \{\}, but must be a non-empty dict"):
        automl.SearchSpace({})
    with pytest.raises(ValueError, match=r"`space` is \[1\], but must be a non-empty dict"):
        automl.SearchSpace([1])


def test_space_rejects_non_str_keys():
    with pytest.raises(TypeError, match=r"`space` has the key 1, but every key must be a str"):
        automl.SearchSpace({1: [1]})
