"""Sharing frozen computation in transfer-learning model selection: Nautilus, Vista and HAPI (pure torch + OR-Tools).

- ``profile``: torch.fx layer graph with FLOPs, sizes, frozen and materializable flags (HF models: blocks as leaves).
- ``multimodel``: merge identical materializable sub-expressions across models.
- ``milp``: the materialization MILP (equations 9-10), the cost model and the FLOPs-optimal bound (equation 11).
- ``fusion`` / ``memory``: model fusion (Algorithm 1) under a live-tensor peak-memory estimate; fused training.
- ``feature_store``: append-only (layer key, sample id) features in memory-mapped shards.
- ``split``: HAPI's split index and feature-extraction batch sizes.
- ``transfer``: ``plan_transfer`` (engine API) and ``TransferSelection`` (in-process labelling cycles).
"""

from framework.planner.execution import KeyedModule, build_branch, build_bridge, build_extractor, trainable_state_dict
from framework.planner.feature_store import FeatureStore
from framework.planner.fusion import FusedGroup, FusedTrainer, fuse_models
from framework.planner.memory import estimate_peak_memory
from framework.planner.milp import (
    CostModel,
    MaterializationPlan,
    ReusePlan,
    exhaustive_materialization,
    flops_optimal_speedup,
    measure_cost_model,
    measure_read_bandwidth,
    optimize_materialization,
    solve_reuse,
)
from framework.planner.multimodel import MultiModelGraph, build_multimodel
from framework.planner.profile import LayerGraph, LayerNode, huggingface_leaves, profile_model
from framework.planner.split import ExtractionRequest, choose_extraction_batch_sizes, choose_split_index
from framework.planner.transfer import (
    EXECUTIONS,
    METHODS,
    TransferPlan,
    TransferResult,
    TransferSelection,
    plan_transfer,
)

__all__ = [
    "EXECUTIONS",
    "METHODS",
    "CostModel",
    "ExtractionRequest",
    "FeatureStore",
    "FusedGroup",
    "FusedTrainer",
    "KeyedModule",
    "LayerGraph",
    "LayerNode",
    "MaterializationPlan",
    "MultiModelGraph",
    "ReusePlan",
    "TransferPlan",
    "TransferResult",
    "TransferSelection",
    "build_branch",
    "build_bridge",
    "build_extractor",
    "build_multimodel",
    "choose_extraction_batch_sizes",
    "choose_split_index",
    "estimate_peak_memory",
    "exhaustive_materialization",
    "flops_optimal_speedup",
    "fuse_models",
    "huggingface_leaves",
    "measure_cost_model",
    "measure_read_bandwidth",
    "optimize_materialization",
    "plan_transfer",
    "profile_model",
    "solve_reuse",
    "trainable_state_dict",
]
