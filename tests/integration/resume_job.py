"""A driver that the resume test starts as a subprocess and kills mid-epoch: `python resume_job.py STORAGE`."""

from __future__ import annotations

import sys

import automl
import framework
from framework.examples import digits_arrays
from tests.integration.ft_functions import classifier_eval_fn, mlp_model_fn, slow_train_fn

SPACE = {"hidden": [16, 32], "lr": [0.05, 0.1], "batch_size": [64], "sleep": [0.15]}


def selection(storage_path: str) -> framework.ModelSelection:
    x, y = digits_arrays()
    ds = framework.PartitionedDataset.from_arrays(x[:800], y[:800], num_partitions=2, seed=0)
    # one worker holding both partitions: the dispatch order, and so every weight, is reproducible run to run
    return framework.ModelSelection(
        mlp_model_fn, slow_train_fn, classifier_eval_fn, ds, automl.GridSearch(SPACE, epochs=3),
        num_workers=1, seed=3, storage_path=storage_path, progress=False,
    )


if __name__ == "__main__":
    selection(sys.argv[1]).run()
