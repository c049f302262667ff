"""The search features Ray Tune users reach for, each on the real engine: PB2 and BOHB run to the end with their
models in use, PBT's `hyperparam_mutations` change only the named hyper-parameters of a clone, and every search-space
primitive (quantised, normal, nested, `sample_from`) goes through GridSearch, RandomSearch and OptunaSearch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import automl
import framework
from automl.space import SearchSpace
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from simulators import validate_schedule

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def small_digits(digits):
    x, y = digits
    return framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, seed=0)


def _run(procedure, data, path):
    result = framework.ModelSelection(mlp_model_fn, classifier_train_fn, classifier_eval_fn, data, procedure,
                                      storage_path=str(path), progress=False, seed=0).run()
    assert validate_schedule(result.schedule, availability={0: [0], 1: [1]}, partitions=[0, 1]).ok
    assert (result.status.status != "active").all() and (result.status.status != "failed").all()
    return result


def test_pb2_explores_with_its_gp_on_the_engine(ray_cluster, small_digits, tmp_path, assert_complete):
    # PB2 clones weights, so the architecture stays a constant; three lineage epochs give two perturbations, the
    # second with observations for the GP
    pb2 = automl.PB2({"hidden": 32, "lr": automl.loguniform(0.01, 0.3), "weight_decay": 0.0, "batch_size": 64},
                     population=3, epochs=3,
                     perturbation_interval=1, seed=0, hyperparam_bounds={"lr": automl.loguniform(0.01, 0.3),
                                                                         "weight_decay": [0.0, 0.01]})
    result = _run(pb2, small_digits, tmp_path / "pb2")
    clones = result.status.dropna(subset=["parent"])
    assert len(clones) == 2  # one clone (the worst of three) at each perturbation
    assert pb2.data and all(len(row) == 4 for row in pb2.data)  # (time, lr, weight_decay, change of score)
    for config in result.configs.values():
        assert config["hidden"] == 32 and 0.01 <= config["lr"] <= 0.3 and 0.0 <= config["weight_decay"] <= 0.01
    assert {result.configs[int(c)]["lr"] for c in clones.config_id} != {result.configs[0]["lr"]}
    assert_complete(result)


def test_bohb_fills_its_brackets_and_proposes_from_its_model_on_the_engine(ray_cluster, small_digits, tmp_path,
                                                                          assert_complete):
    # max_epochs 3, eta 3: brackets of 3 configs (1 epoch, the best to 3) and of 2 configs (3 epochs), twice; two at
    # a time, so the second bracket starts after the first rung and TPE has its 3 results at 1 epoch
    bohb = automl.BOHB({"hidden": [16, 32], "lr": automl.loguniform(0.01, 0.3), "batch_size": 64}, max_epochs=3,
                       iterations=2, concurrency=2, min_points_in_model=1, random_fraction=0.0, seed=0)
    result = _run(bohb, small_digits, tmp_path / "bohb")
    status = result.status.set_index("config_id")
    assert len(status) == 10 and sorted(status.epochs) == [1, 1, 1, 1] + [3] * 6
    assert set(status.status[status.epochs == 1]) == {"pruned"} and set(status.status[status.epochs == 3]) == {
        "completed"}
    assert [bohb.model_budget[i] for i in range(3)] == [None] * 3  # the first bracket is drawn from the space
    assert any(b is not None for b in bohb.model_budget.values())
    assert_complete(result)


def test_pbt_hyperparam_mutations_change_only_the_named_values_on_the_engine(ray_cluster, small_digits, tmp_path,
                                                                            assert_complete):
    lr = automl.uniform(0.01, 0.3)
    pbt = automl.PBT({"hidden": 32, "lr": lr, "weight_decay": automl.uniform(0.0, 0.01), "momentum": 0.9,
                      "batch_size": 64},
                     population=3, epochs=2, perturbation_interval=1, seed=0,
                     hyperparam_mutations={"lr": lr, "momentum": [0.8, 0.9]}, resample_probability=0.0,
                     perturbation_factors=(2.0, 0.5))
    result = _run(pbt, small_digits, tmp_path / "pbt")
    clones = result.status.dropna(subset=["parent"])
    assert len(clones) >= 1
    assert all(c["momentum"] in (0.8, 0.9) for c in result.configs.values())  # from the space, then mutated
    for cid, parent in zip(clones.config_id, clones.parent):
        clone, donor = result.configs[int(cid)], result.configs[int(parent)]
        assert clone["weight_decay"] == donor["weight_decay"] and clone["hidden"] == 32  # not mutated: copied
        assert clone["lr"] in (lr.clip(donor["lr"] * 2.0), lr.clip(donor["lr"] * 0.5))
        assert clone["momentum"] in (0.8, 0.9)
    assert_complete(result)


def weight_decay_of(config: dict) -> float:
    """A derived hyper-parameter (`sample_from`): a hundredth of the nested learning rate."""
    return config["opt"]["lr"] / 100


# Every primitive beyond uniform/loguniform/randint/list/constant, in a space the example model trains with.
PRIMITIVES = {
    "hidden": automl.qrandint(16, 32, 16),
    "lr": automl.quniform(0.05, 0.2, 0.05),
    "momentum_scale": automl.qloguniform(0.1, 1.0, 0.1),
    "opt": {"lr": automl.loguniform(1e-3, 1e-1), "eps": 1e-8},
    "weight_decay": automl.sample_from(weight_decay_of),
    "batch_size": 64,
}
NORMAL = {"noise": automl.randn(0.0, 1.0), "shift": automl.qrandn(10.0, 2.0, 0.5)}
# what GridSearch takes: lists, constants (a dict without domains too) and sample_from
GRID = {"hidden": [16, 32], "lr": [0.05, 0.1], "opt": {"lr": 0.01, "eps": 1e-8},
        "weight_decay": automl.sample_from(weight_decay_of), "batch_size": 64}


@pytest.mark.parametrize("name", ["grid", "random", "optuna"])
def test_every_space_primitive_goes_through_the_procedure_on_the_engine(name, ray_cluster, small_digits, tmp_path,
                                                                        assert_complete):
    if name == "grid":
        for domain in (*(PRIMITIVES[k] for k in ("hidden", "lr", "momentum_scale")), *NORMAL.values()):
            with pytest.raises(ValueError, match=r"but a grid needs a list of values, not a random"):
                automl.GridSearch({**GRID, "x": domain}, epochs=1)
        with pytest.raises(ValueError, match=r"a nested space, but GridSearch grids over top"):
            automl.GridSearch({**GRID, "opt": PRIMITIVES["opt"]}, epochs=1)
        space, procedure = GRID, automl.GridSearch(GRID, epochs=1)
    elif name == "random":
        space = {**PRIMITIVES, **NORMAL}
        procedure = automl.RandomSearch(space, num_samples=3, epochs=1, seed=0)
    else:
        with pytest.raises(ValueError, match=r"Optuna has no normal distribution"):
            automl.OptunaSearch({**PRIMITIVES, **NORMAL}, num_samples=3, epochs=1)
        space = PRIMITIVES
        procedure = automl.OptunaSearch(space, num_samples=3, epochs=1, sampler="tpe", concurrency=2, seed=0)
    result = _run(procedure, small_digits, tmp_path / name)
    assert (result.status.status == "completed").all() and len(result.configs) == (4 if name == "grid" else 3)
    for config in result.configs.values():
        assert SearchSpace(space).contains(config)
        assert config["weight_decay"] == config["opt"]["lr"] / 100 and config["opt"]["eps"] == 1e-8
        if name != "grid":
            assert config["hidden"] in (16, 32) and config["lr"] in (0.05, 0.1, 0.15, 0.2)
            assert round(config["momentum_scale"], 1) == config["momentum_scale"]
        if name == "random":
            assert config["shift"] % 0.5 == 0
    if name == "grid":
        assert sorted((c["hidden"], c["lr"]) for c in result.configs.values()) == [(16, 0.05), (16, 0.1), (32, 0.05),
                                                                                  (32, 0.1)]
    assert_complete(result)


def float32_weight_decay(config: dict) -> np.float32:
    return np.float32(0.05)


def int64_steps(config: dict) -> np.int64:
    return np.int64(7)


def numpy_flag(config: dict) -> np.bool_:
    return np.bool_(True)


def tensor_scale(config: dict) -> torch.Tensor:
    return torch.tensor(0.25)  # a 0-d tensor: its number


def a_set(config: dict) -> set:
    return {config["hidden"]}


# numpy and torch values where configs are drawn: choices, a constant, sample_from
NUMPY_GRID = {"hidden": [np.int64(16)], "lr": [np.float32(0.1)], "shape": [(16, 16)], "batch_size": np.int64(64),
              "wd": automl.sample_from(float32_weight_decay), "steps": automl.sample_from(int64_steps),
              "flag": automl.sample_from(numpy_flag), "scale": automl.sample_from(tensor_scale)}


def test_model_fn_gets_the_same_python_values_in_the_run_on_its_resume_and_on_its_replay(ray_cluster, small_digits,
                                                                                     tmp_path, assert_complete):
    """`typed_model_fn` fails a config whose values are not exactly the Python types a config holds (the string
    '0.05' a replay once got for np.float32(0.05)); `typed_eval_fn` reports the `wd` a worker got. The run stops
    after its first decision (its time budget), resumes from the catalog, and is replayed."""
    from tests.integration.probe_functions import typed_eval_fn, typed_model_fn

    held = {"hidden": 16, "lr": float(np.float32(0.1)), "shape": [16, 16], "batch_size": 64,
            "wd": 0.05000000074505806, "steps": 7, "flag": True, "scale": 0.25}
    path = str(tmp_path / "run")
    first = framework.ModelSelection(typed_model_fn, classifier_train_fn, typed_eval_fn, small_digits,
                                     automl.GridSearch(NUMPY_GRID, epochs=2), storage_path=path, progress=False, seed=0,
                                     time_budget_s=1e-3).run()
    assert list(first.status.status) == ["active"] and list(first.metrics.epoch) == [0]
    resumed = framework.ModelSelection.resume(path, typed_model_fn, classifier_train_fn, typed_eval_fn,
                                              progress=False, time_budget_s=None).run()
    again = framework.replay(path)  # the recorded functions, by name
    for result in (resumed, again):
        assert list(result.status.status) == ["completed"], result.status.error.tolist()  # model_fn never failed
        [config] = result.configs.values()
        assert config == held and [type(v) for v in config.values()] == [type(v) for v in held.values()]
        assert list(result.metrics.epoch) == [0, 1] and list(result.metrics.valid_wd) == [held["wd"]] * 2
    assert_complete(resumed)


def test_a_value_a_config_cannot_hold_is_refused_at_the_draw_before_any_config_is_written(ray_cluster, small_digits,
                                                                                       tmp_path):
    path = tmp_path / "run"
    with pytest.raises(TypeError, match=r"^`space\['bad'\]` is \{16\}, a set, but a config holds JSON values only.*"
                                        r"\(what sample_from\(a_set\) returned\)$"):
        framework.ModelSelection(mlp_model_fn, classifier_train_fn, classifier_eval_fn, small_digits,
                                 automl.RandomSearch({"hidden": [16], "bad": automl.sample_from(a_set)}, num_samples=2,
                                                     epochs=1), storage_path=str(path), progress=False).run()
    assert framework.Result.open(str(path)).configs == {}
