"""Ray Tune's ASHA, PBT, PB2 and BOHB examples, ported: the search spaces stay written with `tune.*` (Tune's docs'
spaces, shrunk), only the imports and the trainable change (into `model_fn` and `step_fn`). Each runs a tiny
selection on the session's Ray; every config holds drawn values, never Tune's objects. A run in which every config
failed says so (`Result.all_failed`, its closing line), and does not raise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import automl
import framework

tune = pytest.importorskip("ray.tune")
pytestmark = pytest.mark.ray


def model_fn(config):
    """Tune's ASHA example's net, shrunk: two hidden layers of `l1` and `l2` units (digits: 64 inputs, 10 classes)."""
    model = torch.nn.Sequential(torch.nn.Linear(64, config["l1"]), torch.nn.ReLU(),
                                torch.nn.Linear(config["l1"], config["l2"]), torch.nn.ReLU(),
                                torch.nn.Linear(config["l2"], 10))
    momentum = config.get("arch", {}).get("momentum", config.get("momentum", 0.9))
    return model, torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=momentum)


def step_fn(model, batch, config):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"accuracy": (logits.argmax(1) == y).float().mean()}


def broken_model_fn(config):
    raise TypeError(f"'<' not supported between instances of 'Float' and 'float' (lr={config['lr']!r})")


@pytest.fixture(scope="module")
def tiny(digits):
    x, y = digits
    return framework.PartitionedDataset.from_arrays(x[:300], y[:300], num_partitions=2, valid_fraction=0.2, seed=0)


def _select(tiny, tmp_path, procedure, fn=model_fn, **options):
    return framework.ModelSelection(fn, step_fn=step_fn, dataset=tiny, procedure=procedure, num_workers=2,
                                    storage_path=str(tmp_path / "run"), metric="valid_accuracy", mode="max", seed=0,
                                    progress=False, **options).run()


def _drawn(result, space_check):
    """Every config is plain values (what a run records) and lies where the Tune space says."""
    assert result.configs and not result.all_failed
    for config in result.configs.values():
        space_check(config)
    assert (result.status.status != "failed").all()
    assert result.best_config_id is not None


def test_tunes_asha_example(ray_cluster, tiny, tmp_path):
    # Tune: tune.Tuner(train_cifar, param_space=config, tune_config=tune.TuneConfig(num_samples=..., scheduler=
    #       ASHAScheduler(max_t=max_num_epochs, grace_period=1, reduction_factor=2)))
    config = {"l1": tune.choice([2 ** i for i in range(3, 6)]), "l2": tune.choice([2 ** i for i in range(3, 6)]),
              "lr": tune.loguniform(1e-4, 1e-1), "batch_size": tune.choice([16, 32])}
    asha = automl.ASHA(config, max_epochs=2, eta=2, min_epochs=1, max_configs=3, seed=0)
    result = _select(tiny, tmp_path, asha)
    _drawn(result, lambda c: (c["l1"] in (8, 16, 32) and c["l2"] in (8, 16, 32) and 1e-4 <= c["lr"] <= 0.1
                              and c["batch_size"] in (16, 32)))
    assert set(result.status.status) <= {"completed", "pruned"}


def test_tunes_pbt_example(ray_cluster, tiny, tmp_path):
    # Tune: PopulationBasedTraining(perturbation_interval=..., hyperparam_mutations={"lr": tune.uniform(0.0001, 1),
    #       "momentum": [0.8, 0.9, 0.99]}), param_space={"lr": tune.uniform(0.001, 1), "momentum": tune.uniform(...)}
    param_space = {"lr": tune.uniform(0.001, 0.1), "momentum": tune.uniform(0.001, 0.99), "l1": 16, "l2": 16,
                   "batch_size": 32}
    pbt = automl.PBT(param_space, population=3, epochs=2, perturbation_interval=1, seed=0,
                     hyperparam_mutations={"lr": tune.uniform(0.0001, 0.1), "momentum": [0.8, 0.9, 0.99]})
    result = _select(tiny, tmp_path, pbt)
    _drawn(result, lambda c: 0.0001 <= c["lr"] <= 0.1 and 0.001 <= c["momentum"] <= 0.99 and c["l1"] == 16)
    assert result.status.parent.notna().any()  # an exploit happened: a clone of a donor


def test_tunes_pb2_example_with_nested_bounds(ray_cluster, tiny, tmp_path):
    # Tune: PB2(perturbation_interval=..., hyperparam_bounds={"lr": [0.0001, 0.02]}), param_space={"lr": 0.0001, ...};
    # here with a nested hyper-parameter as Tune writes its bounds
    param_space = {"lr": 0.0001, "l1": 16, "l2": 16, "batch_size": 32, "arch": {"momentum": 0.9}}
    pb2 = automl.PB2(param_space, population=3, epochs=2, perturbation_interval=1, seed=0,
                     hyperparam_bounds={"lr": [0.0001, 0.02], "arch": {"momentum": [0.8, 0.99]}})
    result = _select(tiny, tmp_path, pb2)
    _drawn(result, lambda c: (0.0001 <= c["lr"] <= 0.02 and 0.8 <= c["arch"]["momentum"] <= 0.99
                              and set(c) == set(param_space)))
    clones = result.status.dropna(subset=["parent"]).config_id
    assert len(clones) >= 1 and all(set(result.configs[int(c)]) == set(param_space) for c in clones)


def test_tunes_bohb_example(ray_cluster, tiny, tmp_path):
    # Tune: TuneBOHB() + HyperBandForBOHB(max_t=100, reduction_factor=4), param_space={"width": tune.uniform(0, 20),
    #       "height": tune.uniform(-100, 100), "activation": tune.choice(["relu", "tanh"])}
    config = {"l1": tune.qrandint(8, 32, 8), "l2": tune.choice([8, 16]), "lr": tune.uniform(0.001, 0.1),
              "batch_size": 32}
    bohb = automl.BOHB(config, max_epochs=2, eta=2, concurrency=2, min_points_in_model=1, seed=0)
    result = _select(tiny, tmp_path, bohb)
    _drawn(result, lambda c: c["l1"] in (8, 16, 24, 32) and c["l2"] in (8, 16) and 0.001 <= c["lr"] <= 0.1)


def test_a_run_in_which_every_config_failed_says_so_and_returns(ray_cluster, tiny, tmp_path, capsys):
    space = {"lr": tune.loguniform(1e-4, 1e-1), "l1": 8, "l2": 8, "batch_size": 32}
    result = _select(tiny, tmp_path, automl.RandomSearch(space, num_samples=2, epochs=1, seed=0), fn=broken_model_fn,
                     max_unit_retries=0)
    assert result.all_failed and result.best_config_id is None
    lines = capsys.readouterr().err.strip().splitlines()
    summary = [line for line in lines if line.startswith("Results: ")]
    assert len(summary) == 1 and "(2 configs, every config failed; the first: TypeError: '<' not supported" in summary[0]
    assert "best None" not in summary[0]
