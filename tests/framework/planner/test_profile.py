from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.planner import build_branch, build_extractor, build_multimodel, profile_model
from framework.planner.execution import boundary_keys
from tests.framework.planner.conftest import Head, frozen_encoder


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.c1(x))  # (B, 8, 8, 8)
        h = h + self.c2(h)
        return self.fc(h.mean((2, 3)))


def test_profile_linear_flops_and_bytes_match_hand_computed() -> None:
    m = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))
    g = profile_model(m, torch.randn(4, 10))
    n = list(g.nodes.values())
    assert [x.flops for x in n] == [0, 2 * 10 * 20, 20, 2 * 20 * 5]  # 2*MACs; relu: 1 per element
    assert [x.out_bytes for x in n] == [40, 80, 80, 20]
    assert n[1].param_bytes == (10 * 20 + 20) * 4
    assert not any(x.materializable for x in n[1:])  # trainable


def test_profile_residual_cnn_flags_and_conv_flops() -> None:
    m = Residual()
    m.c1.weight.requires_grad_(False)
    g = profile_model(m, torch.randn(1, 3, 8, 8))
    assert g.nodes["c1"].flops == 2 * (3 * 9) * 8 * 64
    assert g.nodes["c2"].flops == 2 * (8 * 9) * 8 * 64
    assert g.nodes["relu"].materializable and g.nodes["c1"].materializable
    assert not g.nodes["c2"].materializable and g.nodes["add"].frozen and not g.nodes["add"].materializable
    assert g.nodes["add"].parents == ("relu", "c2")
    assert g.boundary() == ("relu",)


def test_profile_transformer_encoder_layer_is_a_leaf_with_matmul_flops() -> None:
    g = profile_model(Head(frozen_encoder()), torch.randint(0, 20, (2, 6)))
    assert g.nodes["enc_l1"].op == "call_module" and g.nodes["enc_l1"].materializable
    # in-proj + out-proj + feed-forward are at least 2*T*(3*D*D + D*D + 2*D*F)
    assert g.nodes["enc_l1"].flops >= 2 * 6 * (4 * 16 * 16 + 2 * 16 * 32)
    assert g.nodes["enc_l1"].act_bytes > g.nodes["enc_l1"].out_bytes == 6 * 16 * 4
    assert not g.nodes["fc"].materializable


def test_profile_rejects_non_tensor_example() -> None:
    with pytest.raises(ValueError, match="example_input"):
        profile_model(nn.Linear(2, 2), [1, 2])


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 8), nn.Linear(2, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:
        h = torch.relu(self.a(x) + self.b(y)) * scale  # (B, 8)
        return {"logits": self.head(h), "features": h}


def test_profile_tuple_input_and_dict_output_run_through_extractor_and_branch() -> None:
    torch.manual_seed(0)
    model = TwoInputs()
    for p in [*model.a.parameters(), *model.b.parameters()]:
        p.requires_grad_(False)
    x, y = torch.randn(5, 4), torch.randn(5, 2)
    g = profile_model(model, (x[:1], y[:1]))
    assert g.inputs == ("x", "y") and g.nodes[g.output].name == "_model_output"
    assert g.nodes["mul"].storable and g.boundary() == ("mul",)
    mm = build_multimodel([g])
    (h,) = build_extractor(mm, boundary_keys(mm, 0))(x, y)
    (out,) = build_branch(mm, 0)(h)
    ref = model(x, y)
    assert out.keys() == ref.keys()
    torch.testing.assert_close(out["logits"], ref["logits"])
    torch.testing.assert_close(out["features"], ref["features"])


@pytest.mark.parametrize(
    ("example", "match"),
    [
        ({"x": torch.zeros(1, 4), "z": torch.zeros(1, 2)}, "has the keys"),
        ((torch.zeros(1, 4),), "gives no `y`"),
        ((torch.zeros(1, 4), torch.zeros(1, 2), torch.zeros(1), torch.zeros(1)), "holds 4 tensors"),
        ({"x": torch.zeros(1, 4), "y": 3}, "example_input"),
    ],
)
def test_profile_rejects_examples_that_do_not_fit_forward(example, match) -> None:
    with pytest.raises(ValueError, match=match):
        profile_model(TwoInputs(), example)


def test_a_parameter_hash_is_never_inherited_through_a_reused_address():
    """The hash cache is keyed by the tensor itself: a new tensor at a freed one's address (the allocator reuses
    it at once) with other values hashes by its own values."""
    from framework.planner.profile import _hash_tensor

    for _ in range(50):
        a = torch.zeros(64)
        ptr, first = a.data_ptr(), _hash_tensor(a)
        del a
        b = torch.ones(64)
        if b.data_ptr() == ptr:
            break
    else:
        pytest.skip("the allocator never reused the address in 50 tries")
    assert _hash_tensor(b) != first
    assert _hash_tensor(b) == _hash_tensor(torch.ones(64))
