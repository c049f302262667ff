"""Model hopper parallelism (MOP) for deep-learning model selection on Ray.

Public API: `PartitionedDataset`, `ModelSelection`, `Trainable`, `Result`, `replay`; transfer learning that shares frozen
computation: `plan_transfer`, `TransferSelection` (in-process) and `transfer_on_engine` (on the MOP engine).
"""

from framework.data import PartitionedDataset
from framework.planner.engine import EngineTransfer, transfer_on_engine
from framework.planner.transfer import TransferPlan, TransferSelection, plan_transfer
from framework.replay import replay
from framework.result import Result
from framework.selection import EXECUTORS, ModelSelection
from framework.trainable import Trainable

__all__ = [
    "EXECUTORS",
    "EngineTransfer",
    "ModelSelection",
    "PartitionedDataset",
    "Result",
    "TransferPlan",
    "Trainable",
    "TransferSelection",
    "plan_transfer",
    "replay",
    "transfer_on_engine",
]
