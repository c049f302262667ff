"""Ray Tune's words in a space: each `tune.*` domain becomes ours with the same meaning (bounds, log scale, `q`,
choices; a seeded draw lies in Tune's own domain) or is refused when the procedure is constructed, in one line naming
the key; `automl.choice` is a list; PBT's and PB2's nested Tune forms name nested keys, and a name the space lacks is
refused. Optuna's study line stays out of a procedure's output."""

from __future__ import annotations

import logging
import math
import pickle
import subprocess
import sys

import numpy as np
import optuna
import pytest

import automl
import simulators
from automl import SearchSpace
from automl.space import (
    Categorical,
    LogRandInt,
    LogUniform,
    Normal,
    QLogRandInt,
    QLogUniform,
    QNormal,
    QRandInt,
    QUniform,
    RandInt,
    SampleFrom,
    Uniform,
)

tune = pytest.importorskip("ray.tune")


def double_lr(config: dict) -> float:
    """A module-level function of the config: what `tune.sample_from` may hold here (it pickles)."""
    return 2 * config["lr"]


#: (Tune's domain, ours, Tune's `upper` is exclusive: its draws stay below it)
CONVERSIONS = [
    (lambda: tune.uniform(-1.0, 2.5), Uniform(-1.0, 2.5)),
    (lambda: tune.quniform(0.0, 1.0, 0.1), QUniform(0.0, 1.0, 0.1)),
    (lambda: tune.loguniform(1e-4, 1e-1), LogUniform(1e-4, 1e-1)),
    (lambda: tune.qloguniform(1.0, 100.0, 1.0), QLogUniform(1.0, 100.0, 1.0)),
    (lambda: tune.randn(0.5, 2.0), Normal(0.5, 2.0)),
    (lambda: tune.qrandn(0.0, 1.0, 0.25), QNormal(0.0, 1.0, 0.25)),
    (lambda: tune.randint(-3, 7), RandInt(-3, 6)),
    (lambda: tune.qrandint(8, 64, 8), QRandInt(8, 64, 8)),
    (lambda: tune.qrandint(1, 10, 1), RandInt(1, 9)),
    (lambda: tune.lograndint(1, 1000), LogRandInt(1, 999)),
    (lambda: tune.qlograndint(2, 64, 2), QLogRandInt(2, 64, 2)),
    (lambda: tune.qlograndint(1, 10, 1), LogRandInt(1, 9)),
    (lambda: tune.choice(["sgd", "adam", 3]), Categorical(("sgd", "adam", 3))),
    (lambda: tune.sample_from(double_lr), SampleFrom(double_lr)),
]


@pytest.mark.parametrize("make, ours", CONVERSIONS, ids=[repr(o).split("(")[0] + str(i)
                                                        for i, (_, o) in enumerate(CONVERSIONS)])
def test_every_tune_domain_becomes_ours_with_the_same_meaning(make, ours):
    space = SearchSpace({"lr": 0.1, "x": make()})
    assert space.domains["x"] == ours
    if isinstance(ours, SampleFrom):
        assert space.sample(np.random.default_rng(0))["x"] == 0.2
        return
    tune_domain, rng = make(), np.random.default_rng(0)
    for _ in range(300):
        value = space.sample(rng)["x"]
        assert ours.contains(value) and tune_domain.is_valid(value), value
        if isinstance(tune_domain, tune.search.sample.Integer):
            assert isinstance(value, int)
            sampler = tune_domain.get_sampler()
            q = getattr(sampler, "q", 1)
            assert value % q == 0 and value <= tune_domain.upper - (1 if q == 1 else 0)  # Tune's exclusive upper
        elif isinstance(tune_domain, tune.search.sample.Float):
            assert isinstance(value, float)
    # a seeded draw repeats, and the space pickles (a procedure is saved with the run)
    assert SearchSpace({"x": make()}).sample(np.random.default_rng(5)) == SearchSpace({"x": make()}).sample(
        np.random.default_rng(5))
    assert pickle.loads(pickle.dumps(space)) == space


def test_log_domains_are_log_uniform_and_int_ones_cover_their_range():
    rng = np.random.default_rng(1)
    draws = [LogRandInt(1, 999).sample(rng) for _ in range(4000)]
    below_10 = sum(d < 10 for d in draws) / len(draws)
    assert below_10 == pytest.approx(math.log(10) / math.log(1000), abs=0.04)  # a third, not 1%: log-uniform
    assert min(draws) == 1 and max(draws) <= 999
    multiples = {QLogRandInt(2, 64, 2).sample(rng) for _ in range(2000)}
    assert multiples <= set(range(2, 65, 2)) and {2, 64} <= multiples
    assert LogRandInt(1, 999).to_optuna() == optuna.distributions.IntDistribution(1, 999, log=True)
    assert QLogRandInt(2, 8, 2).to_optuna() == optuna.distributions.CategoricalDistribution((2, 4, 6, 8))
    with pytest.raises(ValueError, match=r"`lo` is 0, but must be > 0"):
        automl.lograndint(0, 10)


def test_nested_dicts_of_tune_domains_are_nested_spaces():
    space = SearchSpace({"optim": {"lr": tune.loguniform(1e-3, 0.1), "momentum": tune.uniform(0.8, 0.99),
                                   "name": "sgd"}, "hidden": tune.choice([32, 64])})
    assert list(space.domains) == ["optim/lr", "optim/momentum", "optim/name", "hidden"]
    config = space.sample(np.random.default_rng(0))
    assert 1e-3 <= config["optim"]["lr"] <= 0.1 and config["optim"]["name"] == "sgd" and config["hidden"] in (32, 64)
    assert space.to_optuna()["optim/lr"] == optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)


def test_every_procedure_takes_tune_domains_and_draws_values_never_the_objects():
    space = {"lr": tune.loguniform(1e-3, 0.1), "width": tune.qrandint(16, 64, 16), "act": tune.choice(["a", "b"])}
    for procedure in (automl.RandomSearch(space, num_samples=3, epochs=1), automl.HyperBand(space, max_epochs=3),
                      automl.ASHA(space, max_epochs=3, max_configs=3), automl.TPE(space, num_samples=3, epochs=1),
                      automl.OptunaSearch(space, num_samples=3, epochs=1), automl.BOHB(space, max_epochs=3),
                      automl.PBT(space, population=2, epochs=2, perturbation_interval=1),
                      automl.PB2(space, population=2, epochs=2, perturbation_interval=1)):
        procedure.bind("valid_loss", "min")
        for config in procedure.step([]).add:
            assert 1e-3 <= config["lr"] <= 0.1 and config["width"] in (16, 32, 48, 64) and config["act"] in "ab"
        pickle.dumps(procedure)


def test_grid_search_takes_tunes_grids_and_choices_as_axes():
    grid = automl.GridSearch({"lr": tune.grid_search([0.1, 0.2]), "act": tune.choice(["a", "b"]),
                              "opt": automl.choice(["sgd"]), "batch_size": 32}, epochs=1)
    assert grid.configs() == [{"lr": lr, "act": a, "opt": "sgd", "batch_size": 32} for lr in (0.1, 0.2)
                              for a in ("a", "b")]


@pytest.mark.parametrize("build, error, message", [
    (lambda: automl.RandomSearch({"lr": tune.grid_search([0.1, 0.2])}, 2, 1), ValueError,
     r"^`space\['lr'\]` is Ray Tune's grid_search\(\[0.1, 0.2\]\), but only automl.GridSearch grids .*: write the list "
     r"\[0.1, 0.2\] for a random choice among the values, or use GridSearch$"),
    (lambda: automl.RandomSearch({"f": tune.sample_from(lambda config: 1)}, 2, 1), TypeError,
     r"^`space\['f'\]` is Ray Tune's tune.sample_from\(.*<lambda>\), but its function must pickle .*: write "
     r"automl.sample_from\(fn\) with fn\(config\) a module-level function"),
    (lambda: automl.RandomSearch({"f": tune.sample_from(lambda: 1)}, 2, 1), ValueError,
     r"^`space\['f'\]` is Ray Tune's tune.sample_from\(.*\), a function of no argument: .*write a domain"),
    (lambda: automl.RandomSearch({"x": [tune.uniform(0, 1), 2]}, 2, 1), ValueError,
     r"^`space\['x'\]\[0\]` is Ray Tune's tune.uniform\(0, 1\) inside a list, but a list here is a choice"),
    (lambda: automl.RandomSearch({"o": {"x": (1, tune.randint(0, 3))}}, 2, 1), ValueError,
     r"^`space\['o'\]\['x'\]\[1\]` is Ray Tune's tune.randint\(0, 3\) inside a list"),
    (lambda: automl.RandomSearch({"s": tune.stopper.MaximumIterationStopper(3)}, 2, 1), TypeError,
     r"^`space\['s'\]` is a ray.tune.stopper.* object of Ray Tune, which is no search-space domain"),
    (lambda: automl.RandomSearch({"c": tune.choice([{1, 2}])}, 2, 1), TypeError,
     r"^`space\['c'\]` is Ray Tune's tune.choice\(\[\{1, 2\}\]\): `options\[0\]` is \{1, 2\}, a set"),
    (lambda: automl.GridSearch({"lr": tune.uniform(0.1, 0.2)}, 1), ValueError,
     r"^`space\['lr'\]` is Ray Tune's tune.uniform\(0.1, 0.2\), but a grid needs a list of values"),
    (lambda: automl.GridSearch({"o": {"lr": tune.grid_search([1, 2])}}, 1), ValueError,
     r"^`space\['o'\]\['lr'\]` is Ray Tune's grid_search\(\[1, 2\]\), but GridSearch grids over the top-level"),
    (lambda: automl.ASHA({"lr": tune.randn(0, 1)}, max_epochs=2, max_configs=2), ValueError,
     r"^`space\['lr'\]` is Normal.*Optuna has no normal distribution"),
])
def test_what_has_no_domain_here_is_refused_at_construction_naming_the_key(build, error, message):
    with pytest.raises(error, match=message) as e:
        build()
    assert "\n" not in str(e.value)


def test_a_space_without_tune_objects_imports_nothing_of_ray():
    code = ("import sys, automl; automl.RandomSearch({'lr': automl.loguniform(1e-3, 0.1), 'o': {'a': 1}, "
            "'g': {'grid': [1]}}, 2, 1); automl.GridSearch({'a': [1, 2]}, 1); "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- automl.choice --------------------------------------------------------------------------------------------------
def test_choice_is_the_list():
    assert SearchSpace({"x": automl.choice([1, "a", None])}) == SearchSpace({"x": [1, "a", None]})
    assert automl.choice((1, 2)) == Categorical((1, 2))
    nested = SearchSpace({"o": {"x": automl.choice([1, 2])}})  # a domain: the dict is a nested space
    assert list(nested.domains) == ["o/x"]
    with pytest.raises(TypeError, match=r"`options` is 'ab', but must be a list of values"):
        automl.choice("ab")
    with pytest.raises(ValueError, match=r"`options` is \[\], but must hold at least one value"):
        automl.choice([])
    with pytest.raises(TypeError, match=r"`options\[0\]` is \{1\}, a set"):
        automl.choice([{1}])


# ---- PBT's mutations and PB2's bounds in Tune's forms ---------------------------------------------------------------
SPACE = {"lr": tune.loguniform(1e-3, 0.3), "batch_size": 32, "arch": {"momentum": tune.uniform(0.8, 0.99),
                                                                      "width": 64}}


def _objective(config: dict, epoch: int) -> dict[str, float]:
    loss = abs(config["lr"] - 0.05) + abs(config["arch"]["momentum"] - 0.9) + 1.0 / (epoch + 1)
    return {"train_loss": loss, "valid_loss": loss}


def next_lr() -> float:
    """A Tune-style mutation function: a value of its own (module-level, so it pickles)."""
    return 0.01


def next_layers() -> int:
    return 3


@pytest.mark.parametrize("mutations", [
    {"arch": {"momentum": [0.8, 0.9, 0.99]}, "lr": tune.loguniform(1e-3, 0.3)},
    {"arch/momentum": [0.8, 0.9, 0.99], "lr": automl.loguniform(1e-3, 0.3)},
])
def test_pbt_takes_tunes_nested_mutations_and_mutates_the_nested_key(mutations):
    pbt = automl.PBT(SPACE, population=4, epochs=4, perturbation_interval=1, seed=0, resample_probability=0.0,
                     hyperparam_mutations=mutations)
    assert list(pbt.mutations.domains) == ["arch/momentum", "lr"]
    run = simulators.run_procedure_offline(pbt, _objective, num_workers=2)
    clones = [(donor, config) for d in run.decisions for donor, config in d.clone]
    assert clones
    for donor, config in clones:
        before = run.states[donor].config
        assert set(config) == set(before) and set(config["arch"]) == {"momentum", "width"}  # no new keys
        assert config["arch"]["width"] == 64 and config["batch_size"] == 32
        assert config["arch"]["momentum"] in (0.8, 0.9, 0.99)


def test_pbt_takes_a_mutation_function_and_keeps_an_int_an_int():
    space = {"lr": 0.05, "layers": 4}
    pbt = automl.PBT(space, population=4, epochs=6, perturbation_interval=1, seed=0,
                     hyperparam_mutations={"lr": next_lr, "layers": next_layers})
    run = simulators.run_procedure_offline(pbt, lambda c, e: {"valid_loss": c["lr"] + 1.0 / (e + 1)})
    clones = [config for d in run.decisions for _, config in d.clone]
    assert clones and {c["lr"] for c in clones} - {0.05}  # resampled (0.01) or moved by a factor
    assert all(isinstance(c["layers"], int) for c in clones) and {c["layers"] for c in clones} - {4}
    pickle.dumps(pbt)


def test_pb2_takes_tunes_nested_bounds_and_explores_the_nested_key():
    for bounds in ({"arch": {"momentum": [0.8, 0.99]}}, {"arch/momentum": [0.8, 0.99]},
                   {"arch": {"momentum": tune.uniform(0.8, 0.99)}}):
        pb2 = automl.PB2(SPACE, population=4, epochs=4, perturbation_interval=1, seed=0, hyperparam_bounds=bounds)
        assert list(pb2.bounds) == ["arch/momentum"]
        run = simulators.run_procedure_offline(pb2, _objective, num_workers=2)
        clones = [config for d in run.decisions for _, config in d.clone]
        assert clones and all(set(c) == {"lr", "batch_size", "arch"} for c in clones)
        assert all(0.8 <= c["arch"]["momentum"] <= 0.99 and c["arch"]["width"] == 64 for c in clones)
        assert len({c["arch"]["momentum"] for c in clones}) > 1


def test_pb2_explores_a_key_inside_a_constant_dict():
    space = {"lr": 0.05, "arch": {"momentum": 0.9, "width": 64}}
    pb2 = automl.PB2(space, population=4, epochs=4, perturbation_interval=1, seed=0,
                     hyperparam_bounds={"arch": {"momentum": [0.8, 0.99]}})
    run = simulators.run_procedure_offline(pb2, _objective, num_workers=2)
    clones = [config for d in run.decisions for _, config in d.clone]
    assert clones and all(0.8 <= c["arch"]["momentum"] <= 0.99 and c["arch"]["width"] == 64 for c in clones)


@pytest.mark.parametrize("kwargs, message", [
    ({"hyperparam_bounds": {"momentum": [0.8, 0.99]}},
     r"^`hyperparam_bounds\['momentum'\]` names 'momentum', but `space` has no such hyper-parameter: it has \['lr', "
     r"'batch_size', 'arch/momentum', 'arch/width'\]; add it to the space"),
    ({"hyperparam_bounds": {"arch": {"mom": [0.8, 0.99]}}}, r"^`hyperparam_bounds\['arch/mom'\]` names 'arch/mom'"),
    ({"hyperparam_bounds": {"arch": {}}}, r"^`hyperparam_bounds\['arch'\]` is \{\}, but must name at least one"),
    ({"hyperparam_bounds": {"arch": {"momentum": [0.8, 0.99]}, "arch/momentum": [0.8, 0.9]}},
     r"^`hyperparam_bounds` names 'arch/momentum' twice"),
])
def test_pb2_refuses_a_name_the_space_lacks_naming_the_names_it_has(kwargs, message):
    with pytest.raises(ValueError, match=message):
        automl.PB2(SPACE, population=2, epochs=2, perturbation_interval=1, **kwargs)


@pytest.mark.parametrize("mutations, error, message", [
    ({"momentum": [0.8, 0.9]}, ValueError, r"^`hyperparam_mutations\['momentum'\]` names 'momentum', but `space` has "
                                           r"no such hyper-parameter: it has \['lr', 'batch_size', 'arch/momentum'"),
    ({"lr": lambda: 0.1}, TypeError, r"^`hyperparam_mutations\['lr'\]` is <function .*, but its function .* must "
                                     r"pickle"),
    ({"lr": 0.1}, ValueError, r"^`hyperparam_mutations\['lr'\]` is 0.1, but must be a list, a random domain"),
    ({"lr": tune.grid_search([0.1])}, ValueError, r"^`hyperparam_mutations\['lr'\]` is Ray Tune's grid_search"),
])
def test_pbt_refuses_what_it_cannot_mutate(mutations, error, message):
    with pytest.raises(error, match=message):
        automl.PBT(SPACE, population=2, epochs=2, perturbation_interval=1, hyperparam_mutations=mutations)


# ---- no third-party chatter -----------------------------------------------------------------------------------------
def test_an_optuna_procedure_prints_no_study_line_and_leaves_optunas_verbosity_as_it_was(caplog):
    optuna.logging.set_verbosity(optuna.logging.INFO)
    optuna.logging.enable_propagation()  # (Optuna's records reach caplog too)
    try:
        for procedure in (automl.ASHA(SPACE, max_epochs=2, max_configs=2), automl.TPE(SPACE, num_samples=2, epochs=1),
                          automl.BOHB({"lr": automl.loguniform(1e-3, 0.3), "b": 1}, max_epochs=3, concurrency=1,
                                      min_points_in_model=1)):
            simulators.run_procedure_offline(procedure, _objective)
        assert optuna.logging.get_verbosity() == optuna.logging.INFO  # the user's setting, restored
        optuna.create_study()  # (Optuna's own line still comes for the user's own studies)
    finally:
        optuna.logging.set_verbosity(optuna.logging.INFO)
        optuna.logging.disable_propagation()
    said = [r.getMessage() for r in caplog.records if r.name.startswith("optuna")]
    assert len({m for m in said if "A new study created" in m}) == 1, said  # the user's own study's only


def test_quiet_optuna_keeps_a_quieter_setting():
    from automl._optuna import quiet_optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with quiet_optuna():
            assert optuna.logging.get_verbosity() == optuna.logging.ERROR
        assert optuna.logging.get_verbosity() == optuna.logging.ERROR
    finally:
        optuna.logging.set_verbosity(optuna.logging.INFO)
    assert logging.getLogger("optuna").level == optuna.logging.INFO
