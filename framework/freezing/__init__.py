"""Egeria: layer freezing from reference-model plasticity, with activation caching (pure torch, no Ray)."""

from .cache import ActivationPrefetcher, ActivationStore, MemmapActivationStore
from .controller import FreezingController, frozen_parameter_names
from .modules import LayerModule, is_sequential_chain, split_by_size, split_children, split_regex
from .plasticity import similarity_matrix, sp_loss
from .policy import FreezingPolicy, FreezingPolicyConfig, least_squares_slope
from .reference import AsyncReferenceRunner, PlasticityReading, ReferenceInfo, capture_activation, make_reference

__all__ = [
    "ActivationPrefetcher",
    "ActivationStore",
    "AsyncReferenceRunner",
    "FreezingController",
    "FreezingPolicy",
    "FreezingPolicyConfig",
    "LayerModule",
    "MemmapActivationStore",
    "PlasticityReading",
    "ReferenceInfo",
    "capture_activation",
    "frozen_parameter_names",
    "is_sequential_chain",
    "least_squares_slope",
    "make_reference",
    "similarity_matrix",
    "sp_loss",
    "split_by_size",
    "split_children",
    "split_regex",
]
