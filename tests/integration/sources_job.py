"""A driver that tests/integration/test_sources_on_engine.py starts as a subprocess (under `strace`, to see every file
it opens): `python -m tests.integration.sources_job DATA STORAGE [crash]` trains on the Parquet files in DATA with two
workers, and with `crash` kills itself right after round 0 commits (a run to resume)."""

from __future__ import annotations

import sys

import automl
import framework
from framework.engine.faults import Fault, FaultPlan
from framework.examples import classifier_step_fn, mlp_model_fn

SPACE = {"hidden": [16], "lr": [0.05, 0.1], "batch_size": [64]}


def selection(data: str, storage_path: str, crash: bool = False) -> framework.ModelSelection:
    """Two configs, two epochs, two partitions of the Parquet files under `data/train` and `data/valid`."""
    ds = framework.PartitionedDataset.from_parquet(f"{data}/train", f"{data}/valid", num_partitions=2)
    return framework.ModelSelection(
        mlp_model_fn, step_fn=classifier_step_fn, dataset=ds, procedure=automl.GridSearch(SPACE, epochs=2),
        num_workers=2, seed=0, storage_path=storage_path, progress=False,
        faults=FaultPlan([Fault("crash_driver", after_commit=0)]) if crash else None,
    )


if __name__ == "__main__":
    selection(sys.argv[1], sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "crash").run()
