"""Every AutoML procedure runs to completion on the real engine, and the MOP invariants hold on its schedule."""

from __future__ import annotations

import pytest

import automl
import framework
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from simulators import validate_schedule

pytestmark = pytest.mark.ray

SPACE = {"hidden": [16, 32], "lr": automl.loguniform(0.01, 0.3), "batch_size": [64]}

PROCEDURES = {
    "random": lambda: automl.RandomSearch(SPACE, num_samples=2, epochs=2, seed=0),
    "hyperband": lambda: automl.HyperBand(SPACE, max_epochs=3, eta=3, seed=0),
    "asha": lambda: automl.ASHA(SPACE, max_epochs=3, eta=3, max_configs=4, seed=0),
    "tpe": lambda: automl.TPE(SPACE, num_samples=3, epochs=1, concurrency=2, seed=0),
    # PBT clones weights, so the architecture must not be perturbed: keep `hidden` a constant
    "pbt": lambda: automl.PBT({**SPACE, "hidden": 32}, population=3, epochs=2, perturbation_interval=1, seed=0),
    "custom": lambda: "tests.integration.custom_procedure:TwoConfigs",
}


@pytest.fixture(scope="module")
def small_digits(digits):
    x, y = digits
    return framework.PartitionedDataset.from_arrays(x[:600], y[:600], num_partitions=2, seed=0)


@pytest.mark.parametrize("name", sorted(PROCEDURES))
def test_procedure_runs_on_engine_with_mop_invariants(name, ray_cluster, small_digits, tmp_path, assert_complete):
    result = framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, small_digits, PROCEDURES[name](),
        storage_path=str(tmp_path / name), progress=False, seed=0,
    ).run()
    report = validate_schedule(result.schedule, availability={0: [0], 1: [1]}, partitions=[0, 1])
    assert report.ok, report.violations
    assert (result.status.status != "active").all()
    assert result.best_config_id is not None
    for cid, cfg in result.configs.items():
        assert cfg["hidden"] in (16, 32) and 0.01 <= cfg["lr"] <= 0.3
        assert result.status.set_index("config_id").loc[cid, "status"] != "failed"
        visited = result.load_state(cid)["visited"]
        assert all(sorted(ps) == [0, 1] for ps in visited.values()), f"config {cid} visited {visited}"
    if name == "pbt":
        clones = result.status.dropna(subset=["parent"])
        assert len(clones) >= 1  # exploit happened: clones start from a donor's weights
    if name in ("asha", "tpe"):
        assert (tmp_path / name / "optuna.db").exists()
    assert_complete(result)  # every config's state proves the visits the schedule logged (PBT's clones too)


def test_an_async_run_with_a_failed_config_replays_bit_identically(ray_cluster, small_digits, tmp_path,
                                                                   assert_complete):
    """ASHA runs without the barrier; a config fails evaluating its first epoch; the replay (the driver on LocalBackend,
    repeating the logged order and decisions) gives every config the run's weights and fails the same config."""
    import torch

    from framework.engine.faults import Fault, FaultPlan

    asha = automl.ASHA(SPACE, max_epochs=3, eta=3, max_configs=4, seed=0)
    result = framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, small_digits, asha, storage_path=str(tmp_path / "a"),
        progress=False, seed=0, faults=FaultPlan([Fault("raise", config_id=2, epoch=0, kind="eval")]),
    ).run()
    status = result.status.set_index("config_id").status
    epochs = result.status.set_index("config_id").epochs
    assert status[2] == "failed"
    for cid in status.drop(2).index:  # ASHA completes the configs that reach max_epochs and prunes the rest
        assert status[cid] == ("completed" if epochs[cid] == 3 else "pruned"), (cid, epochs[cid])
    assert "pruned" in set(status)
    again = framework.replay(result.storage_path, out_path=str(tmp_path / "replay"))
    assert again.status.set_index("config_id").status.to_dict() == status.to_dict()
    for cid in result.configs:
        if status[cid] == "failed":
            continue
        a, b = result.load_state(cid), again.load_state(cid)
        assert a["visited"] == b["visited"]
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), f"config {cid} differs"
    merged = result.metrics.merge(again.metrics, on=["config_id", "epoch"], suffixes=("", "_replay"))
    assert len(merged) == len(result.metrics) and (merged.valid_loss == merged.valid_loss_replay).all()
    assert_complete(result)
    assert_complete(again)
