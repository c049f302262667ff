"""AutoML procedures on the epoch-level template (no Ray imports)."""

from automl._base import ACTIVE, FAILED, STATUSES, STOPPED, ConfigState, Decision, FixedEpochsProcedure, Procedure
from automl.grid import GridSearch

__all__ = [
    "ACTIVE",
    "FAILED",
    "STATUSES",
    "STOPPED",
    "ConfigState",
    "Decision",
    "FixedEpochsProcedure",
    "GridSearch",
    "Procedure",
]
