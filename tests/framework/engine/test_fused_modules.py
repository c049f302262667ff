"""Fused modules (`framework.engine.fused_modules`): a fused copy run on the folded batch of k members gives each
member's outputs, gradients and batch-norm running statistics as its own model on its own rows, in both fold
orders; what cannot be fused is refused (None)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import stack_module_state

from framework.engine.fused_modules import fuse

K, B = 3, 5


def _check(make, x: torch.Tensor, batch_major: bool | None = None) -> None:
    """k copies of `make()` fused vs alone on x (k, B, ...): outputs, gradients, running statistics."""
    models = []
    for i in range(K):
        torch.manual_seed(i)
        models.append(make())
    params, buffers = stack_module_state(models)
    stacked = {n: p.detach().requires_grad_() for n, p in params.items()} | dict(buffers)
    fused = fuse(models[0], K, stacked)
    assert fused is not None
    if batch_major is not None:
        fused.fold.batch_major, fused.fold.dim = batch_major, int(batch_major)
    out = fused.fold.split(fused(fused.fold.fold(x)))
    out = out.movedim(fused.fold.dim, 0)
    (out * torch.arange(out.numel()).view(out.shape).sin()).sum().backward()
    for i, model in enumerate(models):
        alone = model(x[i])
        torch.testing.assert_close(out[i], alone, rtol=1e-5, atol=1e-5 * max(1.0, float(alone.abs().max())))
        (alone * torch.arange(out.numel()).view(out.shape)[i].sin()).sum().backward()
        # against the scale of the member's gradients: a bias that batch norm cancels has a gradient of rounding noise
        scale = max(float(p.grad.abs().max()) for p in model.parameters())
        for name, p in model.named_parameters():
            torch.testing.assert_close(stacked[name].grad[i], p.grad, rtol=1e-4, atol=1e-5 * max(1.0, scale), msg=name)
        for name, b in model.named_buffers():
            torch.testing.assert_close(stacked[name][i], b, msg=name)


def _embedding_model() -> nn.Module:
    return nn.Sequential(nn.Embedding(7, 4, scale_grad_by_freq=True), nn.Flatten(), nn.Linear(8, 2))


@pytest.mark.parametrize("batch_major", [False, True], ids=["member-major", "batch-major"])
@pytest.mark.parametrize(("make", "shape"), [
    (lambda: nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2, bias=False)), (4, 4)),  # (B, 4, 4): 3-D
    (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2), nn.BatchNorm2d(4),
                           nn.LayerNorm([4, 3, 3])), (2, 6, 6)),
    (lambda: nn.Sequential(nn.Conv1d(2, 3, 3, dilation=2, padding="same"), nn.BatchNorm1d(3, affine=False),
                           nn.Flatten(), nn.BatchNorm1d(24, momentum=None), nn.LayerNorm(24, bias=False)), (2, 8)),
    (lambda: nn.BatchNorm1d(3, track_running_stats=False), (3,)),
], ids=["linear", "conv2d-bn-ln", "conv1d-bn1d", "bn-batch-stats"])
def test_fused_copy_computes_each_member_as_alone(make, shape, batch_major):
    _check(make, torch.randn(K, B, *shape, generator=torch.Generator().manual_seed(0)), batch_major)


@pytest.mark.parametrize("seed", range(50))
def test_a_bias_that_batch_norm_cancels_matches_for_every_input_draw(seed):
    make = lambda: nn.Sequential(nn.Conv1d(2, 3, 3, dilation=2, padding="same"),  # noqa: E731
                                 nn.BatchNorm1d(3, affine=False), nn.Flatten(), nn.BatchNorm1d(24, momentum=None),
                                 nn.LayerNorm(24, bias=False))
    _check(make, torch.randn(K, B, 2, 8, generator=torch.Generator().manual_seed(seed)), batch_major=True)


def test_embedding_offsets_each_members_indices():
    _check(_embedding_model, torch.randint(0, 7, (K, B, 2)), batch_major=False)
    _check(_embedding_model, torch.randint(0, 7, (K, B, 2)), batch_major=True)


def test_the_fold_is_batch_major_with_convolutions_or_batch_norm():
    assert not fuse(nn.Linear(2, 2), 1, {"weight": torch.ones(1, 2, 2), "bias": torch.ones(1, 2)}).fold.batch_major
    bn = nn.BatchNorm1d(2)
    stacked = {n: t.unsqueeze(0) for n, t in bn.state_dict().items()}
    assert fuse(bn, 1, stacked).fold.batch_major


class _Direct(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


class _Buffered(nn.Linear):
    def __init__(self) -> None:
        super().__init__(2, 2)
        self.register_buffer("shift", torch.zeros(2))


def _hooked() -> nn.Module:
    m = nn.Linear(2, 2)
    m.register_forward_hook(lambda *_: None)
    return m


@pytest.mark.parametrize("make", [
    lambda: nn.MultiheadAttention(4, 2), _Direct, _Buffered, _hooked, lambda: nn.Embedding(3, 2, padding_idx=0),
    lambda: nn.Conv2d(1, 1, 3, padding=1, padding_mode="reflect"), lambda: nn.ConvTranspose2d(1, 1, 3),
], ids=["attention", "direct-parameter", "other-buffer", "hook", "padding-idx", "reflect-padding", "transposed"])
def test_what_cannot_be_fused_is_refused(make):
    model = make()
    stacked = {n: t.detach().unsqueeze(0) for n, t in (*model.named_parameters(), *model.named_buffers())}
    assert fuse(model, 1, stacked) is None
