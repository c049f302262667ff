"""A damaged checkpoint is rebuilt from the schedule log, bit for bit, or left alone with the reason (no Ray: the
driver on a LocalBackend writes a real run directory, stopped as by a crash after its first commit)."""

from __future__ import annotations

import dataclasses
import hashlib
import os

import pytest
import torch

import automl
from framework.driver import Driver, SQLiteRunLog
from framework.engine.local import LocalBackend
from framework.engine.rebuild import rebuild_checkpoints
from framework.examples import classifier_train_fn
from framework.options import RunOptions
from framework.store.catalog import SQLiteCatalog
from framework.store.checkpoint import CheckpointStore
from framework.store.signing import loads_signed
from tests.framework.driver.test_driver import FNS, P, _entries

SPACE = {"lr": [0.01, 0.05], "in_features": [8], "hidden": [8], "classes": [3], "batch_size": [16]}
SEED = 5


def _noisy_train_fn(model, optimizer, data, config):
    """Training that is not deterministic: its weights depend on more than the seed the unit gets."""
    metrics = classifier_train_fn(model, optimizer, data, config)
    with torch.no_grad():
        next(model.parameters()).add_(float.fromhex(os.urandom(2).hex()[:3] + "p-20"))
    return metrics


def _driver(catalog, ckpt, procedure, functions=FNS, checkpoint="unit"):
    backend = LocalBackend(functions, _entries(), num_threads=1)
    return Driver(backend, procedure, SQLiteRunLog(catalog, ckpt), {w: [w] for w in range(P)}, list(range(P)),
                  RunOptions(seed=SEED, checkpoint=checkpoint, queue_depth=1))


@pytest.fixture
def crashed(tmp_path):
    """A run stopped after commit `commits` (as by a crash): (catalog, checkpoint store)."""

    def make(functions=FNS, checkpoint="unit", commits=1):
        catalog = SQLiteCatalog(str(tmp_path / "run.db"))
        ckpt = CheckpointStore(str(tmp_path / "checkpoints"), catalog)
        driver = _driver(catalog, ckpt, automl.GridSearch(SPACE, epochs=3), functions, checkpoint)
        assert driver.run(max_commits=commits) is False
        ckpt.flush()
        return catalog, ckpt

    return make


def _flip(path: str) -> bytes:
    with open(path, "rb") as f:
        original = f.read()
    with open(path, "r+b") as f:
        f.seek(64)
        f.write(b"\xff" * 16)
    return original


def _resume(catalog, ckpt, functions=FNS, checkpoint="unit") -> Driver:
    _, blob, signature = catalog.last_round()
    driver = _driver(catalog, ckpt, loads_signed(blob, signature), functions, checkpoint)
    assert driver.run(resume_from=catalog) is True
    return driver


def _events(catalog, kind: str) -> list:
    events = catalog.events()
    return events[events.kind == kind].detail.tolist()


def test_a_corrupt_newest_checkpoint_is_rebuilt_bit_for_bit_and_the_config_goes_on(crashed):
    catalog, ckpt = crashed()
    [(_, units, path, digest), *older] = catalog.checkpoints(1)
    # the store coalesces queued writes of one config, so under load the previous unit's file may never exist
    before = older[0][1] if older else 0
    original = _flip(path)
    lines = []
    functions = dataclasses.replace(FNS, input_fn=None)
    [outcome] = rebuild_checkpoints(catalog, functions, _entries(), seed=SEED, write=lines.append)
    assert outcome["rebuilt"] and outcome["config_id"] == 1 and outcome["units"] == units
    assert (outcome["from_units"], outcome["rerun"]) == (before, units - before) and units - before >= 1
    with open(path, "rb") as f:
        assert f.read() == original  # the very bytes the run wrote
    assert "config 1: rebuilt its newest checkpoint" in lines[0] and len(_events(catalog, "checkpoint_rebuilt")) == 1
    driver = _resume(catalog, ckpt)
    assert [c.status for c in driver.run_state.configs] == ["stopped", "stopped"]  # nobody failed
    assert [len(c.history) for c in driver.run_state.configs] == [3, 3]
    ckpt.close()
    catalog.close()


def test_with_epoch_checkpoints_a_whole_epoch_is_rerun_in_the_order_the_log_gives(crashed):
    catalog, ckpt = crashed(checkpoint="epoch", commits=2)
    [newest, previous] = catalog.checkpoints(0)[:2]
    assert (newest[1], previous[1]) == (2 * P, P)  # epoch ends: after epochs 1 and 0
    original = _flip(newest[2])
    outcomes = rebuild_checkpoints(catalog, FNS, _entries(), seed=SEED, write=lambda line: None)
    assert [(o["config_id"], o["rebuilt"], o["rerun"]) for o in outcomes] == [(0, True, P)]
    with open(newest[2], "rb") as f:
        assert f.read() == original
    driver = _resume(catalog, ckpt, checkpoint="epoch")
    assert [(c.status, len(c.history)) for c in driver.run_state.configs] == [("stopped", 3), ("stopped", 3)]
    ckpt.close()
    catalog.close()


def test_with_every_checkpoint_gone_a_config_is_rebuilt_from_scratch_within_max_units(crashed):
    catalog, ckpt = crashed()
    rows = catalog.checkpoints(0)
    originals = {path: _flip(path) for _, _, path, _ in rows[:2]}  # both files kept: neither readable
    [refused] = rebuild_checkpoints(catalog, FNS, _entries(), seed=SEED, max_units=P - 1, write=lambda line: None)
    assert not refused["rebuilt"] and "more than `max_units` (2)" in refused["reason"]
    [outcome] = rebuild_checkpoints(catalog, FNS, _entries(), seed=SEED, write=lambda line: None)
    assert outcome["rebuilt"] and outcome["from_units"] == 0 and outcome["rerun"] == rows[0][1] >= P
    with open(rows[0][2], "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == rows[0][3] and f.name in originals
    ckpt.close()
    catalog.close()


def test_a_failure_outside_the_units_is_a_reason_not_an_error(crashed):
    catalog, ckpt = crashed()
    _flip(catalog.checkpoints(1)[0][2])
    [outcome] = rebuild_checkpoints(catalog, FNS, {}, seed=SEED, write=lambda line: None)  # no data to load
    assert not outcome["rebuilt"] and outcome["reason"].startswith("KeyError")
    ckpt.close()
    catalog.close()


def test_training_that_is_not_deterministic_is_not_rebuilt_and_the_config_fails_with_the_reason(crashed):
    functions = dataclasses.replace(FNS, train_fn=_noisy_train_fn)
    catalog, ckpt = crashed(functions)
    _, _, path, _ = catalog.checkpoints(1)[0]
    _flip(path)
    with open(path, "rb") as f:
        damaged = f.read()
    lines = []
    [outcome] = rebuild_checkpoints(catalog, functions, _entries(), seed=SEED, write=lines.append)
    assert not outcome["rebuilt"] and "training is not deterministic" in outcome["reason"]
    with open(path, "rb") as f:
        assert f.read() == damaged  # left as it was
    assert not [f for f in os.listdir(os.path.dirname(path)) if ".tmp." in f]  # and nothing half written beside it
    assert "could not rebuild" in lines[0] and _events(catalog, "checkpoint_rebuild_failed")
    driver = _resume(catalog, ckpt, functions)
    assert driver.run_state.configs[1].status == "failed"  # its readable state lacks what round 0 committed
    assert driver.run_state.configs[0].status == "stopped"
    ckpt.close()
    catalog.close()


def test_a_pbt_clone_is_rebuilt_from_its_starting_checkpoint(tmp_path):
    """A clone's first checkpoint holds its donor's weights and no visits; its epoch is re-run from there."""
    space = {**SPACE, "lr": automl.loguniform(0.01, 0.1)}
    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    ckpt = CheckpointStore(str(tmp_path / "checkpoints"), catalog)
    pbt = automl.PBT(space, population=4, epochs=3, perturbation_interval=1, seed=0)
    assert _driver(catalog, ckpt, pbt, checkpoint="epoch").run(max_commits=2) is False  # the clone trained epoch 0
    ckpt.flush()
    configs = catalog.configs()
    clone = int(configs[configs.parent.notna() & (configs.status == "active")].config_id.iloc[0])
    [newest, start] = catalog.checkpoints(clone)[:2]
    assert (newest[1], start[1]) == (P, 0)
    original = _flip(newest[2])
    outcomes = rebuild_checkpoints(catalog, FNS, _entries(), seed=SEED, write=lambda line: None)
    assert [(o["config_id"], o["rebuilt"], o["from_units"], o["rerun"]) for o in outcomes] == [(clone, True, 0, P)]
    with open(newest[2], "rb") as f:
        assert f.read() == original
    ckpt.close()
    catalog.close()
