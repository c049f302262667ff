"""Fused packs on a GPU (skipped without CUDA; `../shared/GPU.md` says how to run it on a GPU machine): a pack of 4
members (different learning rates) trained one pass on CUDA ends each member with the weights and buffers it reaches
trained alone with `StepLoop` in the same row order, for an MLP, a CNN (both on the fused path) and a one-layer
transformer (any path). The transformer's pack once crashed on CUDA in the backward of vmapped attention
(`RuntimeError: LSE is not correctly aligned (strideH)`): where it still does, the test is an xfail naming it.

Tolerance: float32 with TF32 off; the pack's kernels (one large matmul or grouped convolution on the folded batch,
or attention under vmap) sum in another order than a member's own, so each step's result differs by rounding
(~1e-6 relative), which 8 steps of SGD or Adam carry: rtol 1e-4 against the weights' magnitude (~0.1-1 here), plus
atol 1e-5 for weights near zero (1% of one Adam step at the smallest learning rate, 1e-3)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from experiments import fused_packs  # (its models: the ones the GPU figures are measured on)
from framework.engine.packs import FusedPack
from framework.engine.steps import StepLoop
from framework.examples import classifier_step_fn, mlp_model_fn
from tests.framework.engine.test_packs import _optimizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
N, BATCH, FEATURES, K = 256, 32, 64, 4  # 8 steps of 32 rows; 64 features: an 8x8 image, or 8 tokens of 8
RTOL, ATOL = 1e-4, 1e-5
KNOWN = "LSE is not correctly aligned"  # the error of vmapped attention's backward on CUDA (see the docstring)


# per kind: the members' configs. The MLP: SGD with momentum, as mlp_model_fn builds it. The CNN: Adam at
# experiments/fused_packs.py's learning rates (Adam's first steps move a weight by ~lr whatever its gradient's size,
# so rounding in a small gradient shows in proportion to lr). The transformer: SGD with momentum, as the key
# projection's bias has a gradient of zero up to rounding (softmax ignores a shift of a row of scores), which Adam
# would blow up to steps of ~lr in either direction.
CONFIGS = {
    "mlp": [{"in_features": FEATURES, "hidden": 32, "classes": 10, "lr": lr, "batch_size": BATCH}
            for lr in (0.01, 0.03, 0.1, 0.3)],
    "cnn": [{"optimizer": "adam", "lr": lr, "batch_size": BATCH} for lr in (1e-3, 2e-3, 3e-3, 4e-3)],
    "transformer": [{"optimizer": "sgd", "lr": lr, "batch_size": BATCH} for lr in (0.01, 0.03, 0.1, 0.3)],
}


@pytest.fixture(autouse=True)
def no_tf32():
    """Full float32 matmuls and convolutions (cuDNN takes TF32 by default: 1e-3 relative, not what is tested)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _data(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, FEATURES, generator=g)
    return x.to(device), x[:, :10].argmax(1).to(device)


def _build(kind: str, config: dict, seed: int, device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    if kind == "mlp":
        model, opt = mlp_model_fn(config)
    else:
        model = fused_packs._Cnn() if kind == "cnn" else fused_packs._Transformer()
        opt = _optimizer(model, config)
    return model.to(device), opt  # (`to` moves the parameters the optimizer holds, as on a worker)


def _seed(i: int) -> int:
    return 100 + i  # member i's unit seed: the row order it draws


def _packed(kind: str, device: str) -> tuple[FusedPack, list[nn.Module], list[dict]]:
    configs = CONFIGS[kind]
    built = [_build(kind, c, 10 + i, device) for i, c in enumerate(configs)]
    orders = [torch.randperm(N, generator=torch.Generator().manual_seed(_seed(i))) for i in range(K)]
    pack = FusedPack([m for m, _ in built], [o for _, o in built])
    metrics = pack.train(classifier_step_fn, _data(device), configs, orders)
    pack.write_back()
    return pack, [m for m, _ in built], metrics


def _alone(kind: str, i: int, device: str) -> tuple[nn.Module, dict]:
    model, opt = _build(kind, CONFIGS[kind][i], 10 + i, device)
    torch.manual_seed(_seed(i))  # the unit's seed, before the loop's randperm (on the CPU: the pack's order)
    return model, StepLoop(classifier_step_fn).train(model, opt, _data(device), CONFIGS[kind][i])


def _assert_as_alone(kind: str, models: list[nn.Module], metrics: list[dict], device: str) -> None:
    assert len(models) == len(metrics) == K
    for i, model in enumerate(models):
        alone, alone_metrics = _alone(kind, i, device)
        for (name, a), b in zip(model.state_dict().items(), alone.state_dict().values(), strict=True):
            assert a.device.type == b.device.type == device
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m, i=i, name=name: f"member {i}: "
                                       f"{name}: {m}")
        assert metrics[i]["num_examples"] == alone_metrics["num_examples"] == N
        assert metrics[i]["loss"] == pytest.approx(alone_metrics["loss"], rel=1e-4)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_a_pack_on_cuda_takes_the_fused_path_and_ends_each_member_as_alone(kind):
    pack, models, metrics = _packed(kind, "cuda")
    assert pack.path == "fused", getattr(pack, "why_generic", None)
    _assert_as_alone(kind, models, metrics, "cuda")


def test_a_transformer_pack_on_cuda_ends_each_member_as_alone_or_fails_as_known():
    try:
        pack, models, metrics = _packed("transformer", "cuda")
    except RuntimeError as e:
        if KNOWN not in str(e):
            raise
        first = str(e).strip().splitlines()[0]
        pytest.xfail(f"vmapped attention's backward on CUDA: RuntimeError: {first}")
    assert pack.path in ("fused", "generic")
    _assert_as_alone("transformer", models, metrics, "cuda")
