"""A nested search space on a real run: its configs' `config/<name>` columns are flattened as Ray Tune's are
(`config/optim/momentum`), in `Result.metrics`, the leaderboard, the CSV files next to the run and a Result opened
again from the directory."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

import automl
import framework
from framework.__main__ import main as cli
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn

pytestmark = pytest.mark.ray

SPACE = {"hidden": [16], "lr": [0.05], "batch_size": [32], "extra": {},
         "optim": {"momentum": automl.uniform(0.5, 0.9), "nesterov": False, "schedule": {"warmup": [0, 1]}}}
NESTED = ["config/optim/momentum", "config/optim/nesterov", "config/optim/schedule/warmup"]


def test_nested_configs_flatten_to_config_columns(ray_cluster, digits, tmp_path, capsys):
    ds = framework.PartitionedDataset.from_arrays(*digits, num_partitions=2, seed=0)
    result = framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, automl.RandomSearch(SPACE, num_samples=2,
                                                                                       epochs=1, seed=0),
        storage_path=str(tmp_path / "nested"), progress=False,
    ).run()
    assert len(result.configs) == 2 and all(isinstance(c["optim"], dict) for c in result.configs.values())
    csv = pd.read_csv(os.path.join(result.storage_path, "metrics.csv"))
    board = pd.read_csv(os.path.join(result.storage_path, "leaderboard.csv"))
    again = framework.Result.open(result.storage_path)
    capsys.readouterr()
    assert cli(["show", result.storage_path, "--json"]) == 0  # the command line's table
    shown = pd.DataFrame(json.loads(capsys.readouterr().out)["leaderboard"])
    for df in (result.metrics, result.leaderboard(), csv, board, again.metrics, shown):
        columns = [c for c in df.columns if c.startswith("config/")]
        assert columns == ["config/batch_size", "config/extra", "config/hidden", "config/lr", *NESTED]
        assert len(df) == 2
        for _, row in df.iterrows():
            optim = result.configs[int(row.config_id)]["optim"]
            assert row["config/optim/momentum"] == pytest.approx(optim["momentum"]) and 0.5 <= optim["momentum"] <= 0.9
            assert bool(row["config/optim/nesterov"]) is False
            assert optim["schedule"] == {"warmup": [0, 1]}  # a dict without domains: a constant
            assert row["config/optim/schedule/warmup"] == "[0, 1]"  # a list is one value, as JSON text
            assert row["config/extra"] == "{}"  # an empty dict stays one value, as JSON text
