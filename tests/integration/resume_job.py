"""A driver that the resume tests start as a subprocess and crash on purpose: `python -m tests.integration.resume_job
STORAGE CRASH [CHECKPOINT]` where CRASH is `unit` (die right after config 1's first unit of epoch 1 is logged, before
its checkpoint) or `commit` (die right after round 0 commits), and CHECKPOINT the policy (default `unit`)."""

from __future__ import annotations

import sys

import automl
import framework
from framework.engine.faults import Fault, FaultPlan
from framework.examples import digits_arrays
from tests.integration.ft_functions import classifier_eval_fn, classifier_train_fn, mlp_model_fn

SPACE = {"hidden": [16, 32], "lr": [0.05, 0.1], "batch_size": [64]}
CRASHES = {
    "unit": Fault("crash_driver", config_id=1, epoch=1, kind="train"),
    "commit": Fault("crash_driver", after_commit=0),
}


def selection(storage_path: str, crash: str | None = None, checkpoint: str = "unit") -> framework.ModelSelection:
    x, y = digits_arrays()
    ds = framework.PartitionedDataset.from_arrays(x[:400], y[:400], num_partitions=2, seed=0)
    # one worker holding both partitions, no queue: the dispatch order, and so every weight, is reproducible run to run
    return framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, automl.GridSearch(SPACE, epochs=3),
        num_workers=1, seed=3, storage_path=storage_path, progress=False, scheduler="mwr",
        faults=FaultPlan([CRASHES[crash]]) if crash else None, checkpoint=checkpoint, queue_depth=1,
    )


if __name__ == "__main__":
    selection(*sys.argv[1:4]).run()
