"""The search-space primitives beyond uniform, loguniform, randint, lists and constants (Ray Tune's names): the
quantised `quniform`, `qloguniform`, `qrandint`, the normal `randn`, `qrandn`, nested spaces and `sample_from`;
through `SearchSpace`, RandomSearch, OptunaSearch, GridSearch and PBT (pure Python), and once on the engine."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

import automl
import simulators
from automl.space import MAX_OPTUNA_CHOICES, SearchSpace


def lr_times_ten(config: dict) -> float:
    """A derived hyper-parameter: ten times the nested learning rate."""
    return config["opt"]["lr"] * 10


def hidden_times_two(config: dict) -> int:
    return config["hidden"] * 2


def plus_one_of_double(config: dict) -> int:
    """Reads an earlier sample_from value."""
    return config["double"] + 1


def objective(config: dict, epoch: int) -> dict[str, float]:
    """A smooth synthetic loss over the primitives' space (lower is better)."""
    loss = abs(math.log10(config["opt"]["lr"]) + 2.0) + 0.01 * config["hidden"] / 16 + abs(config["drop"] - 0.2)
    loss = loss / (epoch + 1) + 0.01
    return {"train_loss": loss, "valid_loss": loss}


# Every new primitive Optuna can search, a nested space and a sample_from.
OPTUNA_SPACE = {
    "drop": automl.quniform(0.0, 0.5, 0.1),
    "wd": automl.qloguniform(1e-4, 1e-2, 1e-4),
    "hidden": automl.qrandint(16, 64, 16),
    "opt": {"lr": automl.loguniform(1e-4, 1e-1), "name": ["sgd", "adam"], "betas": (0.9, 0.99)},
    "double": automl.sample_from(hidden_times_two),
    "batch_size": 32,
}
# ... and the normal ones, which only the procedures that draw themselves take.
FULL_SPACE = {**OPTUNA_SPACE, "noise": automl.randn(0.0, 1.0), "shift": automl.qrandn(10.0, 2.0, 0.5)}


def draws(domain, n=400, seed=0):
    rng = np.random.default_rng(seed)
    return [domain.sample(rng) for _ in range(n)]


# ---- quniform ------------------------------------------------------------------------------------------------------
def test_quniform_draws_every_multiple_in_range_exactly():
    values = draws(automl.quniform(3.2, 5.4, 0.2))
    assert sorted(set(values)) == [3.2, 3.4, 3.6, 3.8, 4.0, 4.2, 4.4, 4.6, 4.8, 5.0, 5.2, 5.4]  # 5.4, not 5.4000...04
    assert all(isinstance(v, float) for v in values)


def test_quniform_multiples_need_not_be_the_ends():
    assert sorted(set(draws(automl.quniform(0.05, 0.35, 0.1)))) == [0.1, 0.2, 0.3]


def test_quniform_contains_multiples_in_range_only():
    d = automl.quniform(3.2, 5.4, 0.2)
    assert d.contains(3.4) and d.contains(3.4000000000000004) and d.contains(4)  # rounding error, ints
    assert not d.contains(3.3) and not d.contains(5.6) and not d.contains(3.0) and not d.contains(True)
    assert not d.contains(math.nan) and not d.contains("3.4")


def test_quniform_clip_rounds_to_the_nearest_multiple_inside():
    d = automl.quniform(3.2, 5.4, 0.2)
    assert d.clip(3.31) == 3.4 and d.clip(100.0) == 5.4 and d.clip(-5) == 3.2


def test_quniform_optuna_is_a_float_step_distribution():
    assert automl.quniform(3.2, 5.4, 0.2).to_optuna() == FloatDistribution(3.2, 5.4, step=0.2)
    assert automl.quniform(0.05, 0.35, 0.1).to_optuna() == FloatDistribution(0.1, 0.3, step=0.1)


@pytest.mark.parametrize("q", [0, -0.1])
def test_quniform_q_must_be_positive(q):
    with pytest.raises(ValueError, match=rf"`q` is {q}, but must be > 0"):
        automl.quniform(0.0, 1.0, q)


def test_quniform_q_must_be_a_real_number():
    with pytest.raises(TypeError, match=r"`q` is '0.1', but must be a finite real number"):
        automl.quniform(0.0, 1.0, "0.1")


def test_quniform_needs_a_multiple_in_range():
    with pytest.raises(ValueError, match=r"`q` is 0.1, but no multiple of it lies in \[`lo`, `hi`\] = \[0.11, 0.19\]"):
        automl.quniform(0.11, 0.19, 0.1)


# ---- qloguniform ---------------------------------------------------------------------------------------------------
def test_qloguniform_draws_multiples_log_uniformly():
    values = draws(automl.qloguniform(1e-4, 1e-1, 1e-4), n=1000)
    assert all(1e-4 <= v <= 1e-1 and automl.qloguniform(1e-4, 1e-1, 1e-4).contains(v) for v in values)
    assert all(v == round(v / 1e-4) * 1e-4 or math.isclose(v, round(v / 1e-4) * 1e-4) for v in values)
    assert np.mean(np.array(values) < 1e-3) > 0.2  # a third of the decades: far more than uniform's 1%


def test_qloguniform_lo_must_be_positive():
    with pytest.raises(ValueError, match=r"`lo` is 0.0, but must be > 0 for a log-uniform domain"):
        automl.qloguniform(0.0, 1.0, 0.1)


def test_qloguniform_is_a_categorical_of_its_multiples_for_optuna():
    dist = SearchSpace({"wd": automl.qloguniform(0.1, 0.5, 0.1)}).to_optuna()["wd"]
    assert dist == CategoricalDistribution((0.1, 0.2, 0.3, 0.4, 0.5))


def test_qloguniform_with_too_many_multiples_is_refused_for_optuna_naming_it():
    space = SearchSpace({"wd": automl.qloguniform(1e-4, 1e-1, 5e-5)})  # Tune's example: 1999 multiples
    assert len(space.sample(np.random.default_rng(0))) == 1  # drawing is fine
    with pytest.raises(ValueError, match=rf"`space\['wd'\]` is QLogUniform.*1999 multiples.*{MAX_OPTUNA_CHOICES}"):
        space.to_optuna()


# ---- qrandint ------------------------------------------------------------------------------------------------------
def test_qrandint_draws_int_multiples_both_ends_included():
    values = draws(automl.qrandint(-21, 12, 3))
    assert set(values) == set(range(-21, 13, 3)) and all(type(v) is int for v in values)
    assert set(draws(automl.qrandint(1, 10, 4))) == {4, 8}


def test_qrandint_contains_and_clip():
    d = automl.qrandint(-21, 12, 3)
    assert d.contains(-21) and d.contains(12) and d.contains(0)
    assert not d.contains(4) and not d.contains(15) and not d.contains(3.0) and not d.contains(True)
    assert d.clip(13) == 12 and d.clip(4.4) == 3 and d.clip(-100) == -21


def test_qrandint_optuna_is_an_int_step_distribution():
    assert automl.qrandint(1, 10, 4).to_optuna() == IntDistribution(4, 8, step=4)


def test_qrandint_q_must_be_a_positive_int():
    with pytest.raises(TypeError, match=r"`q` is 2.0, but must be an int"):
        automl.qrandint(0, 10, 2.0)
    with pytest.raises(ValueError, match=r"`q` is 0, but must be > 0"):
        automl.qrandint(0, 10, 0)


def test_qrandint_needs_a_multiple_in_range():
    with pytest.raises(ValueError, match=r"`q` is 5, but no multiple of it lies in \[`lo`, `hi`\] = \[1, 4\]"):
        automl.qrandint(1, 4, 5)


# ---- randn, qrandn -------------------------------------------------------------------------------------------------
def test_randn_draws_the_normal_distribution():
    values = np.array(draws(automl.randn(10, 2), n=4000))
    assert abs(values.mean() - 10) < 0.15 and abs(values.std() - 2) < 0.15
    assert automl.randn().mean == 0.0 and automl.randn().sd == 1.0  # Tune's defaults


def test_randn_contains_any_finite_real():
    d = automl.randn(10, 2)
    assert d.contains(-1e6) and d.contains(3) and d.contains(10.5)
    assert not d.contains(math.inf) and not d.contains(math.nan) and not d.contains(True) and not d.contains("1")
    assert d.clip(1e9) == 1e9  # unbounded


@pytest.mark.parametrize("sd", [0, -1.0])
def test_randn_sd_must_be_positive(sd):
    with pytest.raises(ValueError, match=rf"`sd` is {sd}, but must be > 0"):
        automl.randn(0.0, sd)


def test_randn_mean_must_be_finite():
    with pytest.raises(ValueError, match=r"`mean` is inf, but must be a finite real number"):
        automl.randn(math.inf, 1.0)


def test_qrandn_draws_multiples_of_q():
    d = automl.qrandn(10.0, 2.0, 0.5)
    values = draws(d, n=2000)
    assert all(v * 2 == round(v * 2) for v in values) and len(set(values)) > 10
    assert abs(np.mean(values) - 10) < 0.2
    assert d.contains(10.5) and d.contains(-3.0) and not d.contains(10.25) and not d.contains(math.inf)
    assert d.clip(10.3) == 10.5 and d.clip(10.2) == 10.0


def test_qrandn_q_must_be_positive():
    with pytest.raises(ValueError, match=r"`q` is 0, but must be > 0"):
        automl.qrandn(0.0, 1.0, 0)


@pytest.mark.parametrize("domain", [automl.randn(0, 1), automl.qrandn(0, 1, 0.5)], ids=["randn", "qrandn"])
def test_normal_domains_are_refused_for_optuna_naming_the_parameter(domain):
    with pytest.raises(ValueError, match=r"`space\['opt'\]\['noise'\]` is Q?Normal.*Optuna has no normal distribution"):
        SearchSpace({"opt": {"noise": domain}}).to_optuna()


@pytest.mark.parametrize(
    "make",
    [
        lambda s: automl.OptunaSearch(s, num_samples=2, epochs=1),
        lambda s: automl.TPE(s, num_samples=2, epochs=1),
        lambda s: automl.ASHA(s, max_epochs=3, max_configs=2),
    ],
    ids=["optuna", "tpe", "asha"],
)
def test_optuna_procedures_refuse_normal_domains_at_construction(make):
    with pytest.raises(ValueError, match=r"`space\['noise'\]` is Normal.*Optuna has no normal distribution"):
        make({"lr": automl.loguniform(1e-3, 1e-1), "noise": automl.randn(0, 1)})


# ---- nested spaces -------------------------------------------------------------------------------------------------
def test_nested_space_draws_nested_configs_in_key_order():
    space = SearchSpace({"a": 1, "opt": {"lr": automl.loguniform(1e-4, 1e-1), "name": ["sgd", "adam"],
                                         "inner": {"m": automl.uniform(0.5, 0.9), "k": 3}}, "z": [1, 2]})
    assert list(space.domains) == ["a", "opt/lr", "opt/name", "opt/inner/m", "opt/inner/k", "z"]
    assert space.paths["opt/inner/m"] == ("opt", "inner", "m")
    config = space.sample(np.random.default_rng(0))
    assert list(config) == ["a", "opt", "z"] and list(config["opt"]) == ["lr", "name", "inner"]
    assert list(config["opt"]["inner"]) == ["m", "k"] and config["opt"]["inner"]["k"] == 3
    assert space.contains(config)
    assert space.flatten(config)["opt/inner/m"] == config["opt"]["inner"]["m"]


def test_nested_space_contains_checks_every_level():
    space = SearchSpace({"opt": {"lr": automl.uniform(0.1, 0.2), "name": "sgd"}})
    assert space.contains({"opt": {"lr": 0.15, "name": "sgd"}})
    assert not space.contains({"opt": {"lr": 0.3, "name": "sgd"}})
    assert not space.contains({"opt": {"lr": 0.15}})
    assert not space.contains({"opt": {"lr": 0.15, "name": "sgd", "extra": 1}})
    assert not space.contains({"opt": 0.15}) and not space.contains({"opt/lr": 0.15, "opt/name": "sgd"})


def test_a_dict_without_domains_stays_a_constant():
    # as before nested spaces: lists inside a dict of constants are not choices
    space = SearchSpace({"opt": {"betas": [0.9, 0.99], "eps": 1e-8}, "lr": automl.uniform(0.1, 0.2)})
    assert list(space.domains) == ["opt", "lr"] and isinstance(space.domains["opt"], automl.Constant)
    assert space.sample(np.random.default_rng(0))["opt"] == {"betas": [0.9, 0.99], "eps": 1e-8}
    assert space.to_optuna().keys() == {"lr"}


def test_nested_space_names_must_be_unique_when_flattened():
    with pytest.raises(ValueError, match=r"`space\['a'\]\['b'\]` is named 'a/b', as `space\['a/b'\]` is"):
        SearchSpace({"a/b": 1, "a": {"b": automl.uniform(0, 1)}})


def test_nested_space_keys_must_be_str():
    with pytest.raises(TypeError, match=r"`space\['opt'\]` has the key 1, but every key must be a str"):
        SearchSpace({"opt": {1: automl.uniform(0, 1)}})


def test_nested_space_errors_name_the_path():
    with pytest.raises(ValueError, match=r"`space\['opt'\]\['act'\]` is \[\], but a categorical list must hold"):
        SearchSpace({"opt": {"act": [], "lr": automl.uniform(0, 1)}})


def test_nested_space_optuna_names_join_keys_with_slash():
    space = SearchSpace(OPTUNA_SPACE)
    assert set(space.to_optuna()) == {"drop", "wd", "hidden", "opt/lr", "opt/name"}
    config = space.sample(np.random.default_rng(0))
    params = space.to_optuna_params(config)
    assert set(params) == set(space.to_optuna()) and params["opt/lr"] == config["opt"]["lr"]
    assert space.from_optuna(params) == config


# ---- sample_from ---------------------------------------------------------------------------------------------------
def test_sample_from_is_computed_after_the_other_domains_in_key_order():
    space = SearchSpace({"double": automl.sample_from(hidden_times_two), "hidden": [16, 32],
                         "plus": automl.sample_from(plus_one_of_double)})
    configs = [space.sample(np.random.default_rng(s)) for s in range(20)]
    assert {c["hidden"] for c in configs} == {16, 32}
    assert all(c["double"] == 2 * c["hidden"] and c["plus"] == c["double"] + 1 for c in configs)
    assert list(configs[0]) == ["double", "hidden", "plus"]  # the space's order, though computed last
    assert all(space.contains(c) for c in configs)


def test_sample_from_sees_nested_values_and_draws_nothing():
    space = {"opt": {"lr": automl.loguniform(1e-4, 1e-1)}, "lr10": automl.sample_from(lr_times_ten)}
    a = SearchSpace(space).sample(np.random.default_rng(3))
    b = SearchSpace({"opt": space["opt"]}).sample(np.random.default_rng(3))
    assert a["opt"] == b["opt"] and a["lr10"] == a["opt"]["lr"] * 10  # the generator's draws are unchanged


def test_sample_from_must_be_a_picklable_function():
    with pytest.raises(TypeError, match=r"`fn` is <function .*<lambda>.*, but must pickle \(a module-level function"):
        automl.sample_from(lambda config: 1)
    with pytest.raises(TypeError, match=r"`fn` is 3, but must be a function fn\(config\) -> value"):
        automl.sample_from(3)


def test_every_primitive_pickles():
    space = SearchSpace(FULL_SPACE)
    again = pickle.loads(pickle.dumps(space))
    assert again == space
    assert again.sample(np.random.default_rng(1)) == space.sample(np.random.default_rng(1))


def test_full_space_draws_lie_in_it_and_reproduce():
    space = SearchSpace(FULL_SPACE)
    configs = [space.sample(np.random.default_rng(7)) for _ in range(2)]
    assert configs[0] == configs[1] and space.contains(configs[0])
    rng = np.random.default_rng(0)
    many = [space.sample(rng) for _ in range(200)]
    assert all(space.contains(c) for c in many)


# ---- RandomSearch --------------------------------------------------------------------------------------------------
def test_random_search_configs_lie_in_the_space_and_the_seed_reproduces():
    configs = automl.RandomSearch(FULL_SPACE, num_samples=30, epochs=1, seed=5).configs()
    assert len(configs) == 30 and all(SearchSpace(FULL_SPACE).contains(c) for c in configs)
    assert all(c["double"] == 2 * c["hidden"] and c["opt"]["betas"] == [0.9, 0.99] for c in configs)
    assert configs == automl.RandomSearch(FULL_SPACE, num_samples=30, epochs=1, seed=5).configs()
    assert configs != automl.RandomSearch(FULL_SPACE, num_samples=30, epochs=1, seed=6).configs()


def test_random_search_runs_offline():
    search = automl.RandomSearch(FULL_SPACE, num_samples=4, epochs=2, seed=0)
    run = simulators.run_procedure_offline(search, objective)
    assert len(run.states) == 4 and all(s.epochs == 2 for s in run.states)
    assert all(SearchSpace(FULL_SPACE).contains(s.config) for s in run.states)


# ---- OptunaSearch --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_optuna_search_configs_lie_in_the_space_and_the_seed_reproduces(sampler):
    def run(seed):
        search = automl.OptunaSearch(OPTUNA_SPACE, num_samples=12, epochs=1, sampler=sampler, concurrency=3,
                                     seed=seed)
        return search, [s.config for s in simulators.run_procedure_offline(search, objective).states]

    search, configs = run(0)
    assert len(configs) == 12 and all(SearchSpace(OPTUNA_SPACE).contains(c) for c in configs)
    assert all(c["drop"] in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5) for c in configs)  # exact multiples, not 0.30000000000000004
    assert all(c["double"] == 2 * c["hidden"] for c in configs)
    trial = search.study.trials[0]
    assert set(trial.params) == {"drop", "wd", "hidden", "opt/lr", "opt/name"}
    assert trial.distributions["hidden"] == IntDistribution(16, 64, step=16)
    assert run(0)[1] == configs and run(1)[1] != configs


def test_optuna_search_points_to_evaluate_take_nested_and_quantised_values():
    point = {"drop": 0.3, "wd": 0.0005, "hidden": 48, "opt": {"lr": 0.01, "name": "adam", "betas": (0.9, 0.99)},
             "double": 96, "batch_size": 32}
    search = automl.OptunaSearch(OPTUNA_SPACE, num_samples=3, epochs=1, sampler="random", concurrency=1,
                                 points_to_evaluate=[point])
    run = simulators.run_procedure_offline(search, objective)
    assert run.states[0].config == {**point, "opt": {**point["opt"], "betas": [0.9, 0.99]}}  # (a tuple: a list)
    with pytest.raises(ValueError, match=r"`points_to_evaluate\[0\]` is .*, but must lie in the space"):
        automl.OptunaSearch(OPTUNA_SPACE, num_samples=3, epochs=1, points_to_evaluate=[{**point, "hidden": 40}])


# ---- GridSearch ----------------------------------------------------------------------------------------------------
def test_grid_search_computes_sample_from_at_every_grid_point():
    grid = automl.GridSearch({"hidden": [16, 32], "lr": [0.1, 0.01], "double": automl.sample_from(hidden_times_two),
                              "opt": {"betas": [0.9, 0.99]}}, epochs=1)
    configs = grid.configs()
    assert len(configs) == 4 and all(c["double"] == 2 * c["hidden"] for c in configs)
    assert list(configs[0]) == ["hidden", "lr", "double", "opt"] and configs[0]["opt"] == {"betas": [0.9, 0.99]}


@pytest.mark.parametrize("domain", [automl.quniform(0, 1, 0.5), automl.qloguniform(0.1, 1, 0.1),
                                    automl.qrandint(0, 8, 4), automl.randn(0, 1), automl.qrandn(0, 1, 0.5)],
                         ids=["quniform", "qloguniform", "qrandint", "randn", "qrandn"])
def test_grid_search_rejects_random_domains(domain):
    with pytest.raises(ValueError, match=r"`space\['x'\]` is .*, but a grid needs a list of values, not a random"):
        automl.GridSearch({"x": domain, "y": [1, 2]}, epochs=1)


def test_grid_search_rejects_nested_spaces():
    with pytest.raises(ValueError, match=r"`space\['opt'\]` is .*, a nested space, but GridSearch grids over top"):
        automl.GridSearch({"opt": {"lr": automl.uniform(0, 1)}}, epochs=1)


# ---- PBT -----------------------------------------------------------------------------------------------------------
def test_perturb_keeps_every_primitive_in_its_domain():
    space = SearchSpace(FULL_SPACE)
    rng = np.random.default_rng(0)
    config = space.sample(rng)
    seen = []
    for _ in range(100):
        new = automl.perturb(space, config, rng, 0.25)
        assert space.contains(new) and new["double"] == 2 * new["hidden"] and list(new) == list(config)
        seen.append(new)
        config = new
    assert len({c["hidden"] for c in seen}) > 1 and len({c["drop"] for c in seen}) > 1
    assert len({c["opt"]["lr"] for c in seen}) > 1 and len({c["noise"] for c in seen}) > 1


def test_perturb_moves_normal_values_by_a_factor_and_clips_quantised_ones():
    space = SearchSpace({"noise": automl.randn(0, 1), "h": automl.qrandint(16, 64, 16)})
    new = automl.perturb(space, {"noise": 2.0, "h": 64}, np.random.default_rng(0), 0.25)
    assert new["noise"] in (1.6, 2.4) and new["h"] in (48, 64)  # 64 * 1.2 clips to 64, 64 * 0.8 = 51.2 rounds to 48


def test_pbt_runs_offline_on_every_primitive():
    pbt = automl.PBT(FULL_SPACE, population=4, epochs=4, perturbation_interval=2, seed=0)
    run = simulators.run_procedure_offline(pbt, objective)
    assert len(run.states) > 4  # clones were made
    assert all(SearchSpace(FULL_SPACE).contains(s.config) for s in run.states)


# ---- the engine ----------------------------------------------------------------------------------------------------
@pytest.mark.ray
def test_random_search_with_the_new_primitives_runs_on_the_engine(ray_cluster, digits, tmp_path):
    import framework
    from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn

    space = {
        "hidden": automl.qrandint(16, 32, 16),
        "lr": automl.qloguniform(0.01, 0.1, 0.01),
        "noise": automl.qrandn(0.0, 1.0, 0.5),
        "opt": {"lr": automl.loguniform(1e-3, 1e-1), "eps": 1e-8},
        "weight_decay": automl.sample_from(weight_decay_of),
        "batch_size": 64,
    }
    x, y = digits
    data = framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)
    search = automl.RandomSearch(space, num_samples=2, epochs=1, seed=0)
    result = framework.ModelSelection(mlp_model_fn, classifier_train_fn, classifier_eval_fn, data, search,
                                      storage_path=str(tmp_path / "run"), progress=False, seed=0).run()
    assert (result.status.status == "completed").all() and len(result.configs) == 2
    assert list(result.configs.values()) == search.configs()
    for config in result.configs.values():
        assert SearchSpace(space).contains(config) and config["weight_decay"] == config["opt"]["lr"] / 100


def weight_decay_of(config: dict) -> float:
    return config["opt"]["lr"] / 100
