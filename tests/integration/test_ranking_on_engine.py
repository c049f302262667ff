"""The engine ranks configs in the direction of `mode`: a metric whose best config is known from the configs."""

from __future__ import annotations

import re

import pytest

import automl
import framework
from tests.integration.probe_functions import linear_model_fn, noop_train_fn, score_eval_fn

pytestmark = pytest.mark.ray

QS = [0.3, 0.9, 0.1, 0.5]


@pytest.mark.parametrize("mode", ["max", "min"])
def test_engine_ranks_configs_in_the_direction_of_mode(mode, ray_cluster, digits, tmp_path, capsys):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:100], y[:100], num_partitions=1, seed=0)
    result = framework.ModelSelection(
        linear_model_fn, noop_train_fn, score_eval_fn, ds, automl.GridSearch({"q": QS}, epochs=1),
        num_workers=1, metric="valid_score", mode=mode, storage_path=str(tmp_path / mode), progress=True, seed=0,
    ).run()
    q = {cid: cfg["q"] for cid, cfg in result.configs.items()}
    assert sorted(q.values()) == sorted(QS)
    expected = sorted(q, key=q.get, reverse=mode == "max")
    board = result.leaderboard()
    assert [int(c) for c in board.config_id] == expected
    assert list(board.valid_score) == [q[c] for c in expected]
    assert result.best_config_id == expected[0]
    assert result.best_config == {"q": max(QS) if mode == "max" else min(QS)}
    # the driver's per-round line names the same best config
    printed = re.findall(r"best config (\d+) valid_score=([\d.]+)", capsys.readouterr().out)
    assert printed and int(printed[-1][0]) == expected[0]
    assert float(printed[-1][1]) == pytest.approx(q[expected[0]])
