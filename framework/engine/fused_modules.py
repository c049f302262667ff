"""Fused modules: a copy of a model that runs k members' weights at once on a folded batch (HFTA's horizontal fusion).

`fuse(model, k, stacked)` deep-copies `model` and swaps each parameterized leaf for a fused one over the members'
stacked tensors (`stacked[name]`: (k, ...) per parameter or buffer name of `model`). The copy's own forward, the
user's Python code, then runs unchanged on the members' batches folded into one (k*B, ...) (`Fold`: member-major,
or batch-major when the model has a convolution or batch norm, so that moving the members into the channels is a
view): reshapes, flattening, pooling and activations act row by row, and dropout draws per row, so per member. Each
fused leaf computes all members in one kernel:

    nn.Linear            torch.baddbmm over (k, rows, in): any number of leading dimensions
    nn.Conv1d / Conv2d   one grouped convolution (k*groups groups) over the members' channels (B, k*C, ...)
    nn.BatchNorm1d / 2d  one batch norm over k*C channels, running statistics per member (the stacked buffers)
    nn.LayerNorm         layer_norm without affine, then each member's own scale and shift
    nn.Embedding         each member's indices offset into the stacked (k*V, D) table

A model that holds any other parameterized module (nn.MultiheadAttention, a parameter used directly in a forward,
a parametrization), a buffer outside batch norm, a hook, a conv with padding other than zeros, or an embedding with
`padding_idx`, `max_norm` or `sparse`, cannot be fused: `fuse` returns None. A forward that mixes rows across the
batch (x.mean(0), a transposed batch dimension) folds wrongly: the pack checks the fused copy's outputs against each
member's own module (`member_share`, `differ`) and trusts it only then (`framework.engine.packs`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_unflatten

__all__ = ["Fold", "FusedModel", "differ", "fuse", "member_share", "tolerance"]

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)
_VMAP_MODE = torch._C.DispatchKeySet(torch._C.DispatchKey.FuncTorchVmapMode)


class Fold:
    """How k members' batches (k, B, ...) fold into one (k*B, ...): member-major (member i's rows are rows i*B to
    (i+1)*B - 1; a linear layer's batched matmul then needs no copy) or batch-major (row b*k + i is member i's row
    b; a convolution or batch norm then moves the members into the channels as a view, (B, k*C, ...))."""

    def __init__(self, k: int, batch_major: bool) -> None:
        self.k, self.batch_major = k, batch_major
        self.dim = 1 if batch_major else 0  # the pack dimension of `split`'s view

    def fold(self, x: torch.Tensor) -> torch.Tensor:
        """(k, B, ...) -> (k*B, ...) (a copy when batch-major); the inverse of `members_first`."""
        return (x.transpose(0, 1) if self.batch_major else x).flatten(0, 1)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(k*B, ...) -> a view with the members on dimension `dim`: (B, k, ...) or (k, B, ...)."""
        return x.unflatten(0, (-1, self.k) if self.batch_major else (self.k, -1))

    def members_first(self, x: torch.Tensor) -> torch.Tensor:
        """(k*B, ...) -> (k, B, ...) (a strided view when batch-major)."""
        return self.split(x).transpose(0, 1) if self.batch_major else self.split(x)

    def channels_in(self, x: torch.Tensor) -> torch.Tensor:
        """(k*B, C, ...) -> (B, k*C, ...): the members moved into the channels."""
        x = self.split(x) if self.batch_major else self.split(x).transpose(0, 1)
        return x.flatten(1, 2)

    def channels_out(self, y: torch.Tensor) -> torch.Tensor:
        """(B, k*C, ...) -> (k*B, C, ...): the inverse of `channels_in`."""
        y = y.unflatten(1, (self.k, -1))
        return (y if self.batch_major else y.transpose(0, 1)).flatten(0, 1)

    def per_member(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """A stacked (k, *shape) tensor as a view that broadcasts over `split(x)` (`x` (k*B, ..., *shape))."""
        gap = [1] * (x.dim() - t.dim())
        return t.view(1, self.k, *gap, *t.shape[1:]) if self.batch_major else t.view(self.k, 1, *gap, *t.shape[1:])


class FusedLinear(nn.Module):
    """k `nn.Linear`s: `weight` (k, out, in), `bias` (k, out) or None, one batched matmul."""

    def __init__(self, fold: Fold, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.fold, self.weight, self.bias = fold, weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, batch_major = self.fold.k, self.fold.batch_major
        h = (self.fold.members_first(x) if batch_major else x).reshape(k, -1, x.shape[-1])
        w = self.weight.transpose(1, 2)
        y = torch.bmm(h, w) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), h, w)
        if batch_major:
            return self.fold.fold(y.view(k, -1, *x.shape[1:-1], y.shape[-1]))
        return y.view(*x.shape[:-1], y.shape[-1])


class FusedConv(nn.Module):
    """k `nn.Conv1d`s or `nn.Conv2d`s (zeros padding) as one grouped convolution."""

    def __init__(self, conv: nn.Module, fold: Fold, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.fold, self.weight, self.bias = fold, weight, bias
        self.conv: Callable = F.conv1d if isinstance(conv, nn.Conv1d) else F.conv2d
        self.options = {"stride": conv.stride, "padding": conv.padding, "dilation": conv.dilation,
                        "groups": conv.groups * fold.k}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(self.fold.channels_in(x), self.weight.flatten(0, 1), _flat(self.bias), **self.options)
        return self.fold.channels_out(y)


class FusedBatchNorm(nn.Module):
    """k `nn.BatchNorm1d`s or `2d`s as one batch norm over k*C channels; each member's running statistics are its
    rows of the stacked buffers, updated in place as `_BatchNorm.forward` updates its own."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, fold: Fold, t: Mapping[str, torch.Tensor | None]) -> None:
        super().__init__()
        self.fold, self.eps, self.momentum, self.track = fold, bn.eps, bn.momentum, bn.track_running_stats
        self.weight, self.bias = t["weight"], t["bias"]
        self.running_mean, self.running_var = t["running_mean"], t["running_var"]
        self.num_batches_tracked = t["num_batches_tracked"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # (members with equal counts, checked by `fuse`)
                factor = 1.0 / float(self.num_batches_tracked[0])
        use_stats = not self.training or self.track
        stats = [s.view(-1) if s is not None and use_stats else None for s in (self.running_mean, self.running_var)]
        y = F.batch_norm(self.fold.channels_in(x), *stats, _flat(self.weight), _flat(self.bias),
                         self.training or self.running_mean is None, factor, self.eps)
        return self.fold.channels_out(y)


class FusedLayerNorm(nn.Module):
    """k `nn.LayerNorm`s: one normalization without affine, then each member's scale (and shift)."""

    def __init__(self, ln: nn.LayerNorm, fold: Fold, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.fold, self.shape, self.eps, self.weight, self.bias = fold, tuple(ln.normalized_shape), ln.eps, weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fold.split(F.layer_norm(x, self.shape, None, None, self.eps))
        w = self.fold.per_member(self.weight, x)
        y = y * w if self.bias is None else torch.addcmul(self.fold.per_member(self.bias, x), y, w)
        return y.flatten(0, 1)


class FusedEmbedding(nn.Module):
    """k `nn.Embedding`s as one table (k*V, D): member i's indices offset by i*V."""

    def __init__(self, emb: nn.Embedding, fold: Fold, weight: torch.Tensor) -> None:
        super().__init__()
        self.fold, self.weight, self.scale_grad_by_freq = fold, weight, emb.scale_grad_by_freq
        self.offsets = torch.arange(fold.k, device=weight.device) * weight.shape[1]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        rows = self.fold.split(idx) + self.fold.per_member(self.offsets, idx)
        y = F.embedding(rows, self.weight.flatten(0, 1), scale_grad_by_freq=self.scale_grad_by_freq)
        return y.flatten(0, 1)


def _flat(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.flatten()


def _leaf(m: nn.Module, fold: Fold, t: Mapping[str, torch.Tensor | None]) -> nn.Module | None:
    """The fused module for leaf `m` over its stacked tensors `t` (by attribute), or None if it has none."""
    kind = type(m)
    if kind.forward is nn.Linear.forward and isinstance(m, nn.Linear):
        return FusedLinear(fold, t["weight"], t.get("bias"))
    if kind.forward in (nn.Conv1d.forward, nn.Conv2d.forward) and m.padding_mode == "zeros":
        return FusedConv(m, fold, t["weight"], t.get("bias"))
    if kind.forward is nn.modules.batchnorm._BatchNorm.forward and isinstance(m, _BATCH_NORMS):
        counts = t.get("num_batches_tracked")
        if m.momentum is None and counts is not None and len(set(counts.tolist())) > 1:
            return None  # (one cumulative-average factor for all members)
        return FusedBatchNorm(m, fold, {n: t.get(n) for n in ("weight", "bias", "running_mean", "running_var",
                                                               "num_batches_tracked")})
    if kind.forward is nn.LayerNorm.forward and isinstance(m, nn.LayerNorm):
        return FusedLayerNorm(m, fold, t["weight"], t.get("bias"))
    if (kind.forward is nn.Embedding.forward and isinstance(m, nn.Embedding) and m.padding_idx is None
            and m.max_norm is None and not m.sparse):
        return FusedEmbedding(m, fold, t["weight"])
    return None


def _transposed(w: torch.Tensor) -> torch.Tensor:
    """`w` (k, out, in) laid out in memory as (k, in, out): a leaf like `w`, same values."""
    if w.stride(1) == 1:
        return w
    return w.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(w.requires_grad)


def _hooked(m: nn.Module) -> bool:
    return any(getattr(m, h, None) for h in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                             "_backward_pre_hooks"))


class FusedModel(nn.Module):
    """The fused copy of a model (`module`) and how it folds the members' batches (`fold`)."""

    def __init__(self, module: nn.Module, fold: Fold) -> None:
        super().__init__()
        self.module, self.fold = module, fold

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def run(self, physical: list, spec: Any) -> Any:
        """The fused copy on the members' inputs: `physical`, the flattened arguments with each tensor (k, B, ...)
        (`spec`: their pytree spec, None for one positional argument), folded. Outside a surrounding vmap's random
        mode, so random ops draw per row, hence per member."""
        args, kwargs = _unflatten([self.fold.fold(x) if torch.is_tensor(x) else x for x in physical], spec)
        with torch._C._ExcludeDispatchKeyGuard(_VMAP_MODE):
            return self(*args, **kwargs)


def _unflatten(leaves: list, spec: Any) -> tuple[tuple, dict]:
    """(args, kwargs) from flattened leaves (spec None: one positional argument)."""
    return (tuple(leaves), {}) if spec is None else tree_unflatten(leaves, spec)


def member_share(fused: list, i: int, fold: Fold) -> list | None:
    """Member i's share of the fused outputs (flattened leaves, folded by `fold`); None where a tensor does not
    fold into k members' outputs."""
    out = []
    for f in fused:
        if torch.is_tensor(f):
            if f.dim() == 0 or f.shape[0] % fold.k:
                return None
            f = fold.split(f).select(fold.dim, i)
        out.append(f)
    return out


def tolerance(t: torch.Tensor) -> float:
    """The relative tolerance for comparing `t` computed two ways: far above rounding, far below what another
    computation gives. TF32 (CUDA matmuls or convolutions that allow it) rounds to 10 bits, so 1e-2 there."""
    if t.dtype not in (torch.float32, torch.float64):
        return 2e-2
    if t.is_cuda and (torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32):
        return 1e-2
    return 1e-3


def differ(got: list, want: list) -> str | None:
    """Why the flattened outputs `got` are not `want` (None: they agree), each floating tensor to `tolerance`
    relative to the magnitude of `want` (an absolute floor for values near zero)."""
    if len(got) != len(want):
        return f"{len(got)} outputs against {len(want)}"
    for j, (f, a) in enumerate(zip(got, want, strict=True)):
        if not (torch.is_tensor(f) and torch.is_tensor(a)):
            if torch.is_tensor(f) or torch.is_tensor(a) or f != a:
                return f"output {j} is {f!r} against {a!r}"
            continue
        if f.shape != a.shape or f.dtype != a.dtype:
            return f"output {j} has shape {tuple(f.shape)} {f.dtype} against {tuple(a.shape)} {a.dtype}"
        if not f.is_floating_point():
            if not torch.equal(f, a):
                return f"output {j} differs ({f.dtype})"
            continue
        tol = tolerance(a)
        scale = float(a.nan_to_num(0.0, 0.0, 0.0).abs().max()) if a.numel() else 0.0
        if not torch.allclose(f, a, rtol=tol, atol=tol * scale + 1e-12, equal_nan=True):
            gap = float((f.double() - a.double()).nan_to_num(float("inf")).abs().max())
            return (f"output {j} differs by up to {gap:.3g} (its scale {scale:.3g}; tolerance {tol:g} of the "
                    "scale)")
    return None


def fuse(model: nn.Module, k: int, stacked: dict[str, torch.Tensor]) -> FusedModel | None:
    """A copy of `model` whose parameterized leaves run k members at once over `stacked` (the members' tensors by
    `model`'s parameter and buffer names, each (k, ...)), or None when some module cannot be fused (module
    docstring). The copy shares no tensor with `model`; it holds `stacked`'s tensors themselves, after giving each
    linear weight the memory layout (k, in, out) (`stacked`'s entry replaced: same shape and values), in which its
    batched matmul and gradient need no copy. The fold is batch-major when the model has a convolution or a batch
    norm, else member-major."""
    name_of = {id(t): n for n, t in (*model.named_parameters(), *model.named_buffers())}
    leaves = [m for m in model.modules() if any(t is not None for t in (*m._parameters.values(), *m._buffers.values()))]
    fold = Fold(k, any(isinstance(m, (nn.Conv1d, nn.Conv2d, *_BATCH_NORMS)) for m in leaves))
    if any(_hooked(m) for m in model.modules()):
        return None
    memo: dict[int, nn.Module] = {}
    for m in leaves:
        tensors = {a: None if t is None else stacked[name_of[id(t)]] for a, t in {**m._parameters, **m._buffers}.items()}
        if isinstance(m, nn.Linear) and tensors["weight"].dim() == 3:
            tensors["weight"] = stacked[name_of[id(m.weight)]] = _transposed(tensors["weight"])
        fused = _leaf(m, fold, tensors) if isinstance(m, _BATCH_NORMS) or not m._buffers else None
        if fused is None or m._modules:
            return None  # (another kind of module, or buffers outside batch norm)
        memo[id(m)] = fused.train(m.training)
    return FusedModel(copy.deepcopy(model, memo), fold)
