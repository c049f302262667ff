"""Plasticity: the similarity-preserving (SP) loss between training and reference activations.

Tung & Mori, "Similarity-Preserving Knowledge Distillation", ICCV 2019; used as Egeria's plasticity (Egeria
section 4.2.1, equation 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def similarity_matrix(activations: torch.Tensor) -> torch.Tensor:
    """Row-normalised pairwise similarity ``normalize_rows(A A^T)`` of a batch of activations.

    Args:
        activations: ``(B, ...)`` activations of one layer for a mini-batch of B samples.

    Returns:
        ``(B, B)`` float tensor whose rows have unit L2 norm (an all-zero row stays zero).
    """
    a = activations.reshape(activations.shape[0], -1).float()  # (B, D)
    g = a @ a.T  # (B, B)
    return F.normalize(g, p=2, dim=1)


def sp_loss(train_activations: torch.Tensor, reference_activations: torch.Tensor) -> torch.Tensor:
    """SP loss ``||G_train - G_ref||_F^2 / B^2`` for the same mini-batch run through two models.

    The two tensors may differ in every dimension but the batch one (SP loss compares the B x B similarity
    patterns, not the activations themselves). Returns a 0-dim float tensor.
    """
    if train_activations.ndim == 0 or reference_activations.ndim == 0:
        raise ValueError(
            "`train_activations` and `reference_activations` must have a batch dimension, but one is 0-dim"
        )
    b = train_activations.shape[0]
    if reference_activations.shape[0] != b:
        raise ValueError(
            f"`reference_activations` has batch size {reference_activations.shape[0]}, "
            f"but must match `train_activations` ({b})"
        )
    diff = similarity_matrix(train_activations) - similarity_matrix(reference_activations)  # (B, B)
    return (diff * diff).sum() / (b * b)
