from __future__ import annotations

import math

import pytest
import torch

from framework.freezing import similarity_matrix, sp_loss


def test_sp_loss_matches_hand_computed_value():
    # G_train = I; G_ref = [[1, 1], [1, 1]] -> rows [1/sqrt2, 1/sqrt2]
    # ||diff||_F^2 = 2 (1 - 1/sqrt2)^2 + 2 (1/2) = 4 - 2 sqrt2, divided by B^2 = 4
    a_train = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    a_ref = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert sp_loss(a_train, a_ref).item() == pytest.approx(1 - math.sqrt(2) / 2, abs=1e-6)


def test_sp_loss_of_three_samples_matches_hand_computed_value():
    # A_train rows e1, e1, e2: G = [[1,1,0],[1,1,0],[0,0,1]] -> rows 1,2 scaled by 1/sqrt2, row 3 = e3
    # A_ref rows e1, e2, e2: G = [[1,0,0],[0,1,1],[0,1,1]] -> row 1 = e1, rows 2,3 scaled by 1/sqrt2
    a_train = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    a_ref = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    # diff rows: [r-1, r, 0], [r, 0, -r], [0, -r, 1-r] -> 2 (1-r)^2 + 4 r^2 = 5 - 2 sqrt2, divided by 9
    assert sp_loss(a_train, a_ref).item() == pytest.approx((5 - 2 * math.sqrt(2)) / 9, abs=1e-6)


def test_sp_loss_is_zero_for_identical_activations():
    a = torch.randn(5, 3, 4, 4)
    assert sp_loss(a, a.clone()).item() == 0.0


def test_sp_loss_is_zero_for_rescaled_activations_and_compares_different_widths():
    a = torch.randn(6, 10)
    assert sp_loss(a, 3.0 * a).item() == pytest.approx(0.0, abs=1e-7)
    assert sp_loss(torch.randn(6, 2, 3, 3), torch.randn(6, 7)).item() > 0


def test_similarity_matrix_rows_have_unit_norm():
    g = similarity_matrix(torch.randn(4, 2, 5))
    assert g.shape == (4, 4)
    assert torch.allclose(g.norm(dim=1), torch.ones(4))


def test_sp_loss_rejects_mismatched_batch_sizes():
    with pytest.raises(
        ValueError, match=r"`reference_activations` has batch size 3, but must match `train_activations` \(2\)"
    ):
        sp_loss(torch.randn(2, 4), torch.randn(3, 4))
