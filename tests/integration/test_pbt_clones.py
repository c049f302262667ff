"""PBT on the engine: a clone starts from its donor's weights and optimizer state, with its own perturbed config."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch

import automl
import framework
from framework.result import CATALOG_FILE
from framework.store.catalog import SQLiteCatalog
from tests.integration.probe_functions import fingerprint_train_fn, linear_model_fn, loss_eval_fn

pytestmark = pytest.mark.ray

LR = automl.uniform(0.01, 0.5)


def _train_units(storage_path: str) -> pd.DataFrame:
    """Done train units in the order they finished, with the metrics each reported."""
    catalog = SQLiteCatalog(os.path.join(storage_path, CATALOG_FILE))
    try:
        units = catalog.units(status="done")
    finally:
        catalog.close()
    units = units[units.kind == "train"].sort_values("end").reset_index(drop=True)
    return pd.concat([units, pd.DataFrame([json.loads(m) for m in units.metrics])], axis=1)


@pytest.fixture(scope="module")
def pbt_run(ray_cluster, digits, tmp_path_factory):
    # population 2 and quantile 0.5: after epoch 0 the worse member is replaced by a clone of the better one
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:120], y[:120], num_partitions=2, seed=0)
    procedure = automl.PBT({"lr": LR}, population=2, epochs=2, perturbation_interval=1, quantile_fraction=0.5, seed=0)
    return framework.ModelSelection(
        linear_model_fn, fingerprint_train_fn, loss_eval_fn, ds, procedure, num_workers=1,
        storage_path=str(tmp_path_factory.mktemp("pbt")), progress=False, seed=0,
    ).run()


def _clone(result) -> tuple[int, int, int]:
    """(clone id, donor id, first round of the clone) of the run's only clone."""
    status = result.status.dropna(subset=["parent"])
    assert len(status) == 1, result.status
    row = status.iloc[0]
    return int(row.config_id), int(row.parent), int(row.first_round)


def test_pbt_clone_replaces_the_worse_member_with_a_perturbed_copy_of_the_better(pbt_run):
    clone, donor, first_round = _clone(pbt_run)
    round0 = pbt_run.metrics[pbt_run.metrics["round"] == 0].set_index("config_id").valid_loss
    assert set(round0.index) == {0, 1} and donor == round0.idxmin()
    assert first_round == 1
    lr = pbt_run.configs[donor]["lr"]
    assert pbt_run.configs[clone]["lr"] in {LR.clip(lr * 0.8), LR.clip(lr * 1.2)}
    assert pbt_run.configs[clone]["lr"] != lr


def test_pbt_clone_starts_from_the_donors_weights_at_the_clone_point(pbt_run):
    clone, donor, first_round = _clone(pbt_run)
    units = _train_units(pbt_run.storage_path)
    donor_last = units[(units.config_id == donor) & (units["round"] < first_round)].iloc[-1]
    clone_first = units[units.config_id == clone].iloc[0]
    assert clone_first["round"] == first_round and clone_first.epoch == 0
    assert clone_first.start_sum == donor_last.end_sum
    # a fresh model would start elsewhere: the fingerprint really tells weights apart
    assert units[units.config_id == 1 - donor].iloc[0].start_sum != donor_last.end_sum


def test_pbt_clone_inherits_the_donors_optimizer_state(pbt_run):
    clone, donor, first_round = _clone(pbt_run)
    units = _train_units(pbt_run.storage_path)
    donor_last = units[(units.config_id == donor) & (units["round"] < first_round)].iloc[-1]
    assert donor_last.end_momentum != 0.0
    assert units[units.config_id == clone].iloc[0].start_momentum == donor_last.end_momentum


def test_pbt_clone_trains_with_its_own_perturbed_learning_rate(pbt_run):
    clone, donor, _ = _clone(pbt_run)
    units = _train_units(pbt_run.storage_path)
    used = set(units[units.config_id == clone].lr)
    assert used == {pbt_run.configs[clone]["lr"]}, f"clone trained with {used}, its config says {pbt_run.configs[clone]}"
    assert set(units[units.config_id == donor].lr) == {pbt_run.configs[donor]["lr"]}


def test_pbt_clone_counts_its_own_epochs_only(pbt_run, assert_complete):
    clone, _, _ = _clone(pbt_run)
    visited = pbt_run.load_state(clone)["visited"]
    assert {e: sorted(ps) for e, ps in visited.items()} == {0: [0, 1]}
    assert set(pbt_run.metrics[pbt_run.metrics.config_id == clone].epoch) == {0}
    assert_complete(pbt_run)  # the exploit copied weights, never visits


def test_pbt_replay_gives_the_clone_the_runs_weights_and_visits(pbt_run, tmp_path, assert_complete):
    again = framework.replay(pbt_run.storage_path, out_path=str(tmp_path / "replay"))
    assert sorted(again.configs) == sorted(pbt_run.configs) and len(pbt_run.configs) > 2  # a clone among them
    for cid in pbt_run.configs:
        a, b = pbt_run.load_state(cid), again.load_state(cid)
        assert a["visited"] == b["visited"], f"config {cid}"
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), f"config {cid} weights differ"
    assert_complete(again)
