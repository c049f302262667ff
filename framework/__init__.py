"""Model hopper parallelism (MOP) for deep-learning model selection on Ray.

Public API: `PartitionedDataset`, `ModelSelection` (its options: `RunOptions`), `Trainable`, `Result`, `replay`;
callbacks and trackers:
`Callback`, `TensorBoardCallback`, `MLflowCallback`, `WandbCallback`; transfer learning that shares frozen
computation: `plan_transfer`, `TransferSelection` (in-process) and `transfer_on_engine` (on the MOP engine).
"""

import importlib
from typing import TYPE_CHECKING, Any

from framework.cluster import implicit_ray

# Ray's implicit start (Ray Data's readers, a `ray.put` before `ray.init`) is the engine's from here on: the run's
# own local Ray, never a cluster another user started on this machine (no Ray import: it waits for Ray's own)
implicit_ray.install()

# Names are imported on first use (PEP 562), so a worker process that needs `framework.engine.worker` does not pay
# for the planner, OR-Tools, pandas and Optuna at start-up.
_EXPORTS = {
    "Callback": "framework.callbacks",
    "MLflowCallback": "framework.trackers",
    "TensorBoardCallback": "framework.trackers",
    "WandbCallback": "framework.trackers",
    "PartitionedDataset": "framework.data",
    "connect": "framework.steering.connect",
    "RunHandle": "framework.steering.connect",
    "EngineTransfer": "framework.planner.engine",
    "transfer_on_engine": "framework.planner.engine",
    "TransferPlan": "framework.planner.transfer",
    "TransferSelection": "framework.planner.transfer",
    "plan_transfer": "framework.planner.transfer",
    "replay": "framework.runs.replay",
    "Result": "framework.result",
    "EXECUTORS": "framework.options",
    "RunOptions": "framework.options",
    "ModelSelection": "framework.selection",
    "Trainable": "framework.trainable",
}

if TYPE_CHECKING:
    from framework.callbacks import Callback
    from framework.data import PartitionedDataset
    from framework.options import EXECUTORS, RunOptions
    from framework.planner.engine import EngineTransfer, transfer_on_engine
    from framework.planner.transfer import TransferPlan, TransferSelection, plan_transfer
    from framework.result import Result
    from framework.runs.replay import replay
    from framework.selection import ModelSelection
    from framework.steering.connect import RunHandle, connect
    from framework.trackers import MLflowCallback, TensorBoardCallback, WandbCallback
    from framework.trainable import Trainable


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'framework' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = [
    "EXECUTORS",
    "Callback",
    "MLflowCallback",
    "TensorBoardCallback",
    "WandbCallback",
    "EngineTransfer",
    "ModelSelection",
    "PartitionedDataset",
    "Result",
    "RunHandle",
    "RunOptions",
    "TransferPlan",
    "Trainable",
    "TransferSelection",
    "connect",
    "plan_transfer",
    "replay",
    "transfer_on_engine",
]
