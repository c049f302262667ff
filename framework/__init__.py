"""Model hopper parallelism (MOP) for deep-learning model selection on Ray.

Public API: `PartitionedDataset`, `ModelSelection`, `Result`, `replay`.
"""

from framework.data import PartitionedDataset
from framework.replay import replay
from framework.result import Result
from framework.selection import EXECUTORS, ModelSelection

__all__ = ["EXECUTORS", "ModelSelection", "PartitionedDataset", "Result", "replay"]
