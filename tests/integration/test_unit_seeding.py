"""Every unit is seeded from (seed, config, epoch, partition): seen through the random draws units report."""

from __future__ import annotations

import json
import os

import pytest

import automl
import framework
from framework.result import CATALOG_FILE
from framework.store.catalog import SQLiteCatalog
from tests.integration.probe_functions import draw_eval_fn, draw_train_fn, linear_model_fn

pytestmark = pytest.mark.ray


def _draws(storage_path: str) -> dict[tuple[int, int, int, str], float]:
    """(config, epoch, partition, kind) -> the draw the unit reported, from the run's units table."""
    catalog = SQLiteCatalog(os.path.join(storage_path, CATALOG_FILE))
    try:
        units = catalog.units(status="done")
    finally:
        catalog.close()
    return {
        (int(r.config_id), int(r.epoch), int(r.partition), r.kind): json.loads(r.metrics)["draw"]
        for r in units.itertuples()
    }


@pytest.fixture(scope="module")
def runs(ray_cluster, digits, tmp_path_factory):
    """Three runs of the same selection (2 configs, 2 partitions, 2 epochs): seed 0 twice, then seed 1."""
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:80], y[:80], num_partitions=2, seed=0)
    out = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        path = str(tmp_path_factory.mktemp(f"seeding_{name}"))
        framework.ModelSelection(
            linear_model_fn, draw_train_fn, draw_eval_fn, ds, automl.GridSearch({"lr": [0.1, 0.2]}, epochs=2),
            num_workers=1, metric="valid_draw", storage_path=path, progress=False, seed=seed,
        ).run()
        out[name] = path
    return out


def test_unit_seeding_gives_every_unit_its_own_draw(runs):
    draws = _draws(runs["a"])
    assert len(draws) == 2 * 2 * 2 * 2  # config x epoch x partition x kind
    for kind in ("train", "eval"):
        assert draws[(0, 0, 0, kind)] != draws[(0, 0, 1, kind)]  # partitions differ
        assert draws[(0, 0, 0, kind)] != draws[(0, 1, 0, kind)]  # epochs differ
        assert draws[(0, 0, 0, kind)] != draws[(1, 0, 0, kind)]  # configs differ
    assert len(set(draws.values())) == len(draws)


def test_unit_seeding_repeats_every_draw_in_a_new_run_with_fresh_workers(runs):
    assert _draws(runs["b"]) == _draws(runs["a"])


def test_unit_seeding_changes_every_draw_with_the_run_seed(runs):
    a, c = _draws(runs["a"]), _draws(runs["c"])
    assert a.keys() == c.keys()
    assert all(a[k] != c[k] for k in a)


def test_unit_seeding_replay_repeats_every_draw(runs, tmp_path):
    again = framework.replay(runs["a"], out_path=str(tmp_path / "replay"))
    assert _draws(again.storage_path) == _draws(runs["a"])
