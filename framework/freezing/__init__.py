"""Egeria: layer freezing from reference-model plasticity, with activation caching (pure torch, no Ray)."""

from .cache import ActivationPrefetcher, ActivationStore, MemmapActivationStore
from .controller import FreezingController, frozen_parameter_names
from .cut import CutError, PrefixCut
from .modules import LayerModule, is_sequential_chain, split_by_size, split_children, split_regex
from .plasticity import similarity_matrix, sp_loss
from .policy import FreezingPolicy, FreezingPolicyConfig, ScaledDefaults, least_squares_slope, scaled_defaults
from .reference import (
    AsyncReferenceRunner,
    PlasticityReading,
    ReferenceInfo,
    capture_activation,
    make_reference,
    time_forward,
)

__all__ = [
    "ActivationPrefetcher",
    "ActivationStore",
    "AsyncReferenceRunner",
    "CutError",
    "FreezingController",
    "FreezingPolicy",
    "FreezingPolicyConfig",
    "LayerModule",
    "MemmapActivationStore",
    "PlasticityReading",
    "PrefixCut",
    "ReferenceInfo",
    "ScaledDefaults",
    "capture_activation",
    "frozen_parameter_names",
    "is_sequential_chain",
    "least_squares_slope",
    "make_reference",
    "scaled_defaults",
    "similarity_matrix",
    "sp_loss",
    "split_by_size",
    "split_children",
    "split_regex",
    "time_forward",
]
