"""Fused packs: k configs of one architecture trained at once in one pass (HFTA's horizontal fusion).

    pack = FusedPack([t.model for t in trainables], [t.optimizer for t in trainables])
    metrics = pack.train(step_fn, data, configs, orders)   # one pass, every member at once
    pack.write_back()                                       # into each member's own model and optimizer
    metrics = pack.evaluate(step_fn, valid, configs)        # every member's evaluation at once (or an eval_step)

The members' parameters and buffers are stacked along a leading pack dimension (`_stack_state`); the user's
`step_fn` runs for all members at once under `torch.func.vmap(randomness="different")`, so its loss, metrics and
random draws are per member whatever it computes; the members' losses are summed and one backward gives each member
the gradient of its own loss; `StackedOptimizer` applies every member's own SGD/Adam/AdamW update (its learning
rate, weight decay, momentum or betas) with a few `torch._foreach_*` calls over all stacked tensors. Member i reads
its batches in its own row order (`orders[i]`), so it ends a pass as it would alone, up to float rounding (dropout's
draws aside).

The model `step_fn` calls takes one of two paths (`FusedPack.path`):

* fused: the call leaves vmap. Its batched inputs are unwrapped to the physical (k, B, ...) tensors and folded to
  (k*B, ...); a copy of the model whose parameterized leaves are fused modules over the stacked tensors
  (`framework.engine.fused_modules`: Linear, Conv1d/2d, BatchNorm1d/2d with per-member running statistics,
  LayerNorm, Embedding) runs the model's own forward on them in a few large kernels (dropout draws per member), and
  the outputs are re-wrapped as batched; autograd flows through. A forward that mixes rows (x.mean(0)) would fold
  wrongly, so the first step of each pass checks the fused outputs against every member's own model on its own rows
  (eval mode, no gradients; k + 1 forwards); on a mismatch the pass goes generic.
* generic: `functional_call` of the architecture on the member's slice of the stacked tensors, under vmap (any model
  vmap takes: MultiheadAttention, parameters used in a forward, other buffers; on a CPU with attention's math kernel,
  for which vmap has a batching rule).

Why: a small model's step is bound by per-op overhead, which vmap's batching rules multiply. Measured on 2 shared
CPU cores, one torch thread, batch 32, pack 8, against the 8 configs trained one at a time (`StepLoop`), samples/s
per config (experiments/fused_packs.py; runs vary by ~20%): width-32 MLP, fused 2.9-3.3x (generic 2.3-2.7x, the
previous all-vmap pack with its per-tensor optimizer 1.8-2.0x); width-128 MLP 2.4-2.6x (generic 1.6-2.2x, previous
1.4-1.8x; what remains is GEMM and the user's loss under vmap: cross-entropy's vmap rule is a Python
decomposition); the CNN 1.5x (grouped convolutions are compute-bound here); the transformer layer, generic, 1.9-2.3x
(previous 1.7x). `torch.compile` of the fused forward (2 s to compile) or of the vmapped step (4 s, graph breaks at
functorch's boundaries) was no faster, so it is not used.

The pack exists for one pass: it is built from the members' states and written back into them, so states, hops,
checkpoints and the schedule stay per config, and a member stopped, cloned or added changes only the next pack. A
member whose loss goes NaN or inf disturbs no other (every kernel and update is per member).

What cannot be packed raises `PackError` naming it (the runner then trains the members one after another):
members that differ in `signature` (parameter and buffer names, shapes, dtypes, devices; the modules' repr; the
optimizer's class and flags); optimizers other than SGD, Adam and AdamW, with several parameter groups, `maximize`,
`amsgrad` or differing `nesterov`; and, while training, members with different batch sizes or a `step_fn` that reads
a config key whose value differs among them (it runs once for all); while evaluating, different `eval_batch_size`s.

LR schedulers: each member keeps its own (on its own torch optimizer). `train(..., lr_schedulers=...)` steps each
member's per-step one after every step of the pass, as `StepLoop` does, and `StackedOptimizer.refresh` re-reads the
members' learning rates (and momenta or betas: OneCycleLR cycles them) into the stacked update, so members with
different schedules each follow their own; an "epoch" schedule the worker steps between passes, as alone (a pack
starts from the members' current learning rates). An enabled GradScaler (mixed precision: its scale, inf checks and
skipped steps per member) is not stacked: the runner trains such members one after another; a disabled one (the
default on a CPU) changes nothing and packs.

Evaluation (`FusedPack.evaluate`) runs every member's `eval_step` (or `step_fn`) at once, as `StepLoop.evaluate`
runs each alone: under `torch.no_grad()`, the model in eval mode and called by the same paths (and check) as in
training, every member on the same batches in order; per member, the same means and `num_examples`.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch._C import _functorch as _ft
from torch._functorch.vmap import lazy_load_decompositions
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from framework.data import data_len
from framework.engine.fused_modules import _unflatten, differ, fuse, member_share
from framework.engine.steps import Means, batch_size_of, check_metric, device_of, split_output, take, to_device
from framework.functions import OPTIMIZER_FLAGS, plain_attributes, signature

__all__ = ["FusedPack", "PackError", "StackedOptimizer"]

_VMAP_MODE = torch._C.DispatchKeySet(torch._C.DispatchKey.FuncTorchVmapMode)
_HYPER = ("lr", "momentum", "dampening", "weight_decay", "betas", "eps")  # (what `StackedOptimizer.refresh` re-reads)


class PackError(ValueError):
    """The members cannot be trained as one fused pack; the message names why."""


def _stack(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """`tensors` stacked, in the memory layout of the stacked parameter `like`."""
    return torch.empty_like(like, requires_grad=False).copy_(torch.stack([t.detach() for t in tensors]))


def _per_member(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """One value per member, shaped (k, 1, ...) to broadcast over a stacked tensor like `like`."""
    return torch.tensor(values, dtype=like.dtype, device=like.device).view(-1, *([1] * (like.dim() - 1)))


def _axpy(x: list[torch.Tensor], y: list[torch.Tensor], a: float | list[torch.Tensor], inplace: bool = False) -> Any:
    """x + a*y over lists of tensors; `a` a float or one per-member tensor per tensor."""
    if isinstance(a, float):
        return (torch._foreach_add_ if inplace else torch._foreach_add)(x, y, alpha=a)
    return (torch._foreach_addcmul_ if inplace else torch._foreach_addcmul)(x, y, a)


class StackedOptimizer:
    """Every member's torch optimizer step at once on the stacked parameters, in `torch._foreach_*` calls over all of
    them: SGD (momentum, dampening, nesterov, weight decay) or Adam/AdamW (betas, eps, weight decay), each
    hyper-parameter a float when the members share it, else one (k, 1, ...) tensor per parameter. The arithmetic is
    torch's single-tensor algorithm's, so a member's update equals its own optimizer's up to rounding.

    `params`: the stacked parameters by name; `names`: their names in the members' optimizer order."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], params: Mapping[str, torch.Tensor],
                 names: Sequence[str]) -> None:
        kinds = {type(o) for o in optimizers}
        if len(kinds) != 1 or not issubclass(kinds.pop(), (torch.optim.SGD, torch.optim.Adam)):
            raise PackError(f"the members' optimizers are {sorted({type(o).__name__ for o in optimizers})}; a pack "
                            "stacks SGD, Adam or AdamW, one class for all members")
        if any(len(o.param_groups) != 1 for o in optimizers):
            raise PackError("a member's optimizer has several parameter groups; a pack stacks one group per member")
        hp = [o.param_groups[0] for o in optimizers]
        for flag in OPTIMIZER_FLAGS:
            if any(h.get(flag, False) for h in hp) and (flag in ("maximize", "amsgrad")
                                                        or len({h.get(flag, False) for h in hp}) > 1):
                raise PackError(f"the members' optimizers set `{flag}` ({[h.get(flag) for h in hp]}), which a pack "
                                "does not stack")
        self.optimizers, self.hp, self.names = list(optimizers), hp, list(names)
        self.params = [params[n] for n in self.names]
        self.adam = isinstance(optimizers[0], torch.optim.Adam)
        states = [[o.state.get(ps[i], {}) for i, o in enumerate(optimizers)]
                  for ps in zip(*(o.param_groups[0]["params"] for o in optimizers), strict=True)]  # [param][member]
        self.stepped = {j for j, s in enumerate(states) if any(s)}  # parameters with state to write back
        (self._init_adam if self.adam else self._init_sgd)(states)
        self._seen = self._snapshot()

    def refresh(self) -> None:
        """Re-read the members' hyper-parameters from their optimizers' param groups, after their LR schedulers
        stepped (a learning rate; OneCycleLR's momentum or betas too): every value derived from them (`neg_lr`,
        `lr64`, `shrink` = 1 - lr*wd, the momenta, betas, ...) follows; the stacked state is untouched. Nothing is
        recomputed when no value changed."""
        self.hp = [o.param_groups[0] for o in self.optimizers]
        seen = self._snapshot()
        if seen != self._seen:
            self._seen = seen
            (self._hyper_adam if self.adam else self._hyper_sgd)()

    def _snapshot(self) -> tuple:
        return tuple(tuple(tuple(map(float, h[key])) if key == "betas" else float(h[key]) for key in _HYPER if key in h)
                     for h in self.hp)

    def _value(self, key: str, f: Callable[[dict], float] | None = None) -> float | list[torch.Tensor]:
        """The members' `key` (or `f(param_group)`): a float when all members share it, else per-member tensors
        (one per parameter, shared among parameters of one rank, dtype and device)."""
        row = [float(f(h) if f else h[key]) for h in self.hp]
        if len(set(row)) == 1:
            return row[0]
        shared: dict[tuple, torch.Tensor] = {}
        for p in self.params:
            if (p.dim(), p.dtype, p.device) not in shared:
                shared[p.dim(), p.dtype, p.device] = _per_member(row, p)
        return [shared[p.dim(), p.dtype, p.device] for p in self.params]

    def _values(self, rows: Sequence[Sequence[float]]) -> float | list[torch.Tensor]:
        """rows[j][i]: member i's value for parameter j; a float when all are equal, else one tensor per param."""
        if len({v for r in rows for v in r}) == 1:
            return float(rows[0][0])
        return [_per_member(r, p) for r, p in zip(rows, self.params, strict=True)]

    def _init_sgd(self, states: list[list[dict]]) -> None:
        self.nesterov, self.momentum_on = bool(self.hp[0].get("nesterov")), [bool(h["momentum"]) for h in self.hp]
        self.bufs = self.fresh = None
        if any(self.momentum_on):  # buf = momentum*buf + c*grad; a member without momentum keeps buf = grad (c = 1)
            self.fresh = [[s.get("momentum_buffer") is None for s in row] for row in states]
            self.bufs = [_stack([torch.zeros_like(p[0]) if f else s["momentum_buffer"] for s, f in zip(row, fr)], p)
                         for row, fr, p in zip(states, self.fresh, self.params, strict=True)]
        self._hyper_sgd()

    def _hyper_sgd(self) -> None:
        """What SGD's update reads of the members' hyper-parameters (`refresh` calls it again)."""
        if [bool(h["momentum"]) for h in self.hp] != self.momentum_on:
            raise PackError("a member's momentum turned on or off in the pass (its LR scheduler's), which a pack "
                            "does not stack")
        self.neg_lr = self._value("", lambda h: -h["lr"])
        self.wd = self._value("weight_decay") if any(h["weight_decay"] for h in self.hp) else None
        if self.bufs is not None:
            self.mom = self._value("momentum")
            self.c = self._value("", lambda h: 1 - h["dampening"] if h["momentum"] else 1.0)
            # a fresh buffer (torch: the first step's gradient itself) is zeros here, taking c = 1 on its first step
            damped = any(f and h["dampening"] and h["momentum"] for fr in self.fresh for f, h in zip(fr, self.hp))
            self.c0 = self._values([[1.0 if f else (1 - h["dampening"] if h["momentum"] else 1.0)
                                     for f, h in zip(fr, self.hp, strict=True)]
                                    for fr in self.fresh]) if damped else self.c

    def _init_adam(self, states: list[list[dict]]) -> None:
        k, like = len(self.hp), self.params[0]
        self.decoupled = isinstance(self.optimizers[0], torch.optim.AdamW) or bool(
            self.hp[0].get("decoupled_weight_decay"))
        self.steps = torch.tensor([[float(s.get("step", 0.0)) for s in row] for row in states],
                                  dtype=torch.float64, device=like.device)  # (P, k)
        self.uniform = bool((self.steps == self.steps[0]).all())  # (every parameter at the same step counts)
        self.exp_avg, self.exp_avg_sq = ([_stack([s.get(key, torch.zeros_like(p[0])) for s in row], p)
                                          for row, p in zip(states, self.params, strict=True)]
                                         for key in ("exp_avg", "exp_avg_sq"))
        self.shapes = [(k, *([1] * (p.dim() - 1))) for p in self.params]
        self._hyper_adam()

    def _hyper_adam(self) -> None:
        """What Adam's update reads of the members' hyper-parameters (`refresh` calls it again)."""
        decay = any(h["weight_decay"] for h in self.hp)
        self.wd = self._value("weight_decay") if decay and not self.decoupled else None
        self.shrink = self._value("", lambda h: 1 - h["lr"] * h["weight_decay"]) if decay and self.decoupled else None
        self.b1c, self.b2 = self._value("", lambda h: 1 - h["betas"][0]), self._value("", lambda h: h["betas"][1])
        self.b2c, self.eps = self._value("", lambda h: 1 - h["betas"][1]), self._value("eps")
        as64 = {"dtype": torch.float64, "device": self.params[0].device}
        self.lr64, self.b1_64, self.b2_64 = (torch.tensor([float(f(h)) for h in self.hp], **as64) for f in (
            lambda h: h["lr"], lambda h: h["betas"][0], lambda h: h["betas"][1]))

    @torch.no_grad()
    def step(self) -> None:
        """One step of every member, for the parameters that have a gradient."""
        idx = [j for j, p in enumerate(self.params) if p.grad is not None]
        if idx:
            ps, gs = [self.params[j] for j in idx], [self.params[j].grad for j in idx]
            (self._adam if self.adam else self._sgd)(idx, ps, gs)
            self.stepped.update(idx)

    def _pick(self, value: float | list[torch.Tensor], idx: list[int]) -> float | list[torch.Tensor]:
        return value if isinstance(value, float) or len(idx) == len(self.params) else [value[j] for j in idx]

    def _c(self, idx: list[int]) -> float | list[torch.Tensor]:
        """The gradient's coefficient in the momentum buffer: `c0` on a parameter's first step in the pack (it
        differs from `c` only for fresh buffers under dampening), else `c`."""
        if self.c0 is self.c or all(j in self.stepped for j in idx):
            return self._pick(self.c, idx)
        values = [(self.c if j in self.stepped else self.c0, j) for j in idx]
        return [v[j] if isinstance(v, list) else _per_member([v], self.params[j]) for v, j in values]

    def _sgd(self, idx: list[int], ps: list[torch.Tensor], gs: list[torch.Tensor]) -> None:
        if self.wd is not None:
            gs = _axpy(gs, ps, self._pick(self.wd, idx))
        step = gs
        if self.bufs is not None:
            bufs = [self.bufs[j] for j in idx]
            torch._foreach_mul_(bufs, self._pick(self.mom, idx))
            _axpy(bufs, gs, self._c(idx), inplace=True)
            step = _axpy(gs, bufs, self._pick(self.mom, idx)) if self.nesterov else bufs
        _axpy(ps, step, self._pick(self.neg_lr, idx), inplace=True)

    def _adam(self, idx: list[int], ps: list[torch.Tensor], gs: list[torch.Tensor]) -> None:
        if self.shrink is not None:
            torch._foreach_mul_(ps, self._pick(self.shrink, idx))
        elif self.wd is not None:
            gs = _axpy(gs, ps, self._pick(self.wd, idx))
        m, v = [self.exp_avg[j] for j in idx], [self.exp_avg_sq[j] for j in idx]
        torch._foreach_lerp_(m, gs, self._pick(self.b1c, idx))
        torch._foreach_mul_(v, self._pick(self.b2, idx))
        b2c = self._pick(self.b2c, idx)
        if isinstance(b2c, float):
            torch._foreach_addcmul_(v, gs, gs, value=b2c)
        else:
            torch._foreach_add_(v, torch._foreach_mul(torch._foreach_mul(gs, gs), b2c))
        if len(idx) == len(self.params):
            self.steps += 1
        else:
            self.steps[idx] += 1
            self.uniform = False
        t = self.steps[:1] if self.uniform else self.steps[idx]  # each member's step count (per parameter)
        neg_sizes, roots = self.lr64 / (self.b1_64 ** t - 1), (1 - self.b2_64 ** t).sqrt()
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, self._shaped(roots, idx, ps))
        torch._foreach_add_(denom, self._pick(self.eps, idx))
        torch._foreach_div_(denom, self._shaped(neg_sizes, idx, ps))
        torch._foreach_addcdiv_(ps, m, denom)  # p - size * m / denom

    def _shaped(self, rows: torch.Tensor, idx: list[int], ps: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per-member values (float64 (1, k): one row for all parameters, or (len(idx), k)) shaped and typed to
        broadcast over each parameter of `idx`."""
        if len(rows) > 1:
            return [rows[r].to(p.dtype).view(self.shapes[j]) for r, (j, p) in enumerate(zip(idx, ps, strict=True))]
        views: dict[tuple, torch.Tensor] = {}
        for j, p in zip(idx, ps, strict=True):
            if (p.dim(), p.dtype) not in views:
                views[p.dim(), p.dtype] = rows[0].to(p.dtype).view(self.shapes[j])
        return [views[p.dim(), p.dtype] for p in ps]

    def write_back(self) -> None:
        """Each member's slice of the stacked state into its own torch optimizer's state (torch's own format)."""
        steps = self.steps.tolist() if self.adam else None
        for i, opt in enumerate(self.optimizers):
            for j, param in enumerate(opt.param_groups[0]["params"]):
                if j not in self.stepped:
                    continue
                if self.adam:
                    opt.state[param] = {"step": torch.tensor(steps[j][i]),
                                        "exp_avg": self.exp_avg[j][i].clone(),
                                        "exp_avg_sq": self.exp_avg_sq[j][i].clone()}
                elif self.bufs is not None and self.hp[i]["momentum"] != 0:
                    opt.state[param] = {"momentum_buffer": self.bufs[j][i].clone()}


class _Reads(dict):
    """A config that records the keys `step_fn` reads (so the pack can check they agree among its members)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)


class _PackModel:
    """What `step_fn` gets as its model inside the pack's vmap: a call runs every member's model on its own inputs
    by the pack's path (module docstring); attributes are the architecture's (on the meta device: read, never
    computed with). `mode`: "check" (the next call checks the members, `FusedPack.check`, then takes the path it
    allows), "fused" or "generic"."""

    def __init__(self, pack: FusedPack) -> None:
        self._pack, self.level, self.mode = pack, 0, "generic"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pack = self._pack
        if self.mode != "generic":
            leaves, spec = (args, None) if len(args) == 1 and not kwargs else tree_flatten((args, kwargs))
            physical, batched = self._unwrap(leaves)
            if self.mode == "check":
                self.mode = pack.check(physical, batched, spec)
            if self.mode == "fused" and all(batched):
                out = pack.fused.run(physical, spec)
                return self._wrap(out) if torch.is_tensor(out) else tree_map(self._wrap, out)
        weights = {n: _ft._add_batch_dim(t, 0, self.level) for n, t in pack.tensors.items()}
        with pack.attention():  # (attention's math kernel: vmap has a rule for it; see `FusedPack.__init__`)
            return functional_call(pack.base, weights, args, kwargs)

    def _unwrap(self, leaves: list) -> tuple[list, list[bool]]:
        """The inputs with each tensor batched over the members as its physical (k, B, ...) tensor, and which
        were (a tensor that is not, e.g. a constant the step made, is the same for every member)."""
        out, batched = [], []
        for x in leaves:
            is_batched = isinstance(x, torch.Tensor) and _ft.maybe_get_level(x) == self.level and x.dim() > 0
            if is_batched:
                x = _ft._remove_batch_dim(x, self.level, self._pack.k, 0)
            out.append(x)
            batched.append(is_batched or not isinstance(x, torch.Tensor))
        return out, batched

    def _wrap(self, y: Any) -> Any:
        fold = self._pack.fused.fold
        return _ft._add_batch_dim(fold.split(y), fold.dim, self.level) if torch.is_tensor(y) else y

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pack.base, name)


def _dropout_stand_in(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
                      ) -> torch.Tensor:
    return input * (1 - p) if training else input  # (deterministic, and still tells p and the mode apart)


def _random_stand_ins() -> dict[Callable, Callable]:
    """Random ops as deterministic stand-ins that keep their arguments' effect (`_Deterministic`)."""
    F = torch.nn.functional
    out: dict[Callable, Callable] = {f: _dropout_stand_in for f in (
        F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout, torch.dropout,
        torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout)}
    out.update({
        torch.rand: lambda *size, **kw: torch.full(_size(size), 0.5, **_factory(kw)),
        torch.randn: lambda *size, **kw: torch.zeros(_size(size), **_factory(kw)),
        torch.rand_like: lambda x, **kw: torch.full_like(x, 0.5, **_factory(kw)),
        torch.randn_like: lambda x, **kw: torch.zeros_like(x, **_factory(kw)),
        torch.bernoulli: lambda x, p=None, **kw: x if p is None else torch.full_like(x, p),
        torch.normal: lambda mean, std=1.0, *a, **kw: (mean if torch.is_tensor(mean) else
                                                       torch.full(_size(a[:1] or (kw.get("size", ()),)), mean)),
        torch.Tensor.uniform_: lambda x, a=0.0, b=1.0, **kw: x.fill_((a + b) / 2),
        torch.Tensor.normal_: lambda x, mean=0.0, std=1.0, **kw: x.fill_(mean),
        torch.Tensor.bernoulli_: lambda x, p=0.5, **kw: x.copy_(p) if torch.is_tensor(p) else x.fill_(p),
    })
    return out


def _size(size: tuple) -> tuple:
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size


def _factory(kw: dict) -> dict:
    return {k: v for k, v in kw.items() if k in ("dtype", "device", "requires_grad")}


class _Deterministic(TorchFunctionMode):
    """Random ops replaced by deterministic stand-ins (`_random_stand_ins`), so a member's own forward and the pack's
    computation for it can be compared in training mode, dropout included: both get the same stand-ins. A random
    op not replaced makes the two differ, and the pack trains its members alone (safe, not fast)."""

    _STAND_INS: dict[Callable, Callable] | None = None

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if _Deterministic._STAND_INS is None:
            _Deterministic._STAND_INS = _random_stand_ins()
        stand_in = _Deterministic._STAND_INS.get(func)
        return (stand_in or func)(*args, **(kwargs or {}))


class FusedPack:
    """k members' models and optimizers as one stacked model for one pass (see the module docstring). `generic`:
    never take the fused path (for comparisons). `ids`: the members' config ids, for messages. `path`: the path
    the last pass took ("fused" or "generic"); `why_generic`: why not fused (None when it was)."""

    def __init__(self, models: Sequence[torch.nn.Module], optimizers: Sequence[torch.optim.Optimizer], *,
                 generic: bool = False, ids: Sequence[int] | None = None) -> None:
        if not models or len(models) != len(optimizers):
            raise PackError(f"a pack needs one optimizer per model, got {len(models)} models, {len(optimizers)}")
        signatures = [signature(m, o) for m, o in zip(models, optimizers, strict=True)]
        if len({s[0] for s in signatures}) != 1:
            raise PackError("the members' models differ in their parameters' names, shapes or dtypes; a pack "
                            "stacks one architecture")
        if len({s[1] for s in signatures}) != 1:
            raise PackError("the members' models differ in their modules or their plain attributes (an activation, "
                            "a dropout rate, `self.act`); a pack runs one architecture's forward")
        self.models, self.k = list(models), len(models)
        self.ids = list(range(self.k)) if ids is None else list(ids)  # (what messages call the members)
        params, buffers = _stack_state(self.models)
        self.params = {n: p.detach().requires_grad_(p.requires_grad) for n, p in params.items()}
        self.tensors = {**self.params, **buffers}
        self.base = copy.deepcopy(self.models[0]).to("meta")
        self.fused = None if generic else fuse(self.models[0], self.k, self.tensors)
        self.params = {n: self.tensors[n] for n in self.params}  # (as `fuse` laid them out)
        self.path = "generic" if self.fused is None else "fused"
        self.why_generic = None if self.fused is not None else "asked for" if generic else (
            "a module the fused path does not cover (framework.engine.fused_modules)")
        names_of = [{id(p): n for n, p in m.named_parameters()} for m in self.models]
        try:
            orders = [[names_of[i][id(p)] for p in o.param_groups[0]["params"]] for i, o in enumerate(optimizers)]
        except KeyError:
            raise PackError("a member's optimizer holds a tensor that is not its model's parameter") from None
        if len({tuple(o) for o in orders}) != 1:
            raise PackError("the members' optimizers hold their parameters in different orders")
        self.optimizer = StackedOptimizer(optimizers, self.params, orders[0])
        self._model = _PackModel(self)
        # attention's math kernel on every device: vmap has a batching rule for it, and the fused kernels' backward
        # under vmap fails on CUDA ("LSE is not correctly aligned", an H200); for the small models packs are for,
        # the math kernel costs little
        self.attention = lambda: sdpa_kernel([SDPBackend.MATH])

    def check(self, physical: list, batched: list[bool], spec: Any) -> str:
        """The member check, on a pass's first call of the model (`_PackModel`): each member's own module (its own
        object, attributes and forward) on its own inputs, against what the pack computes for it, in training mode
        and in eval mode, random ops as deterministic stand-ins (`_Deterministic`), without gradients, every
        running statistic restored after. Returns "fused" where the fused copy agrees with every member's own
        module in both modes; else checks the generic computation (the lead's module on each member's weights) the
        same way and returns "generic" (`why_generic` says why not fused). Raises `PackError` naming the first
        member whose own forward differs from it, or whose forward changes its module's plain attributes (a step
        counter: the pack runs one copy). 2 (k + 1) forwards on the fused path, 4k on the generic one."""
        fold = None if self.fused is None else self.fused.fold
        inputs = [_unflatten([x[i] if b and torch.is_tensor(x) else x for x, b in zip(physical, batched, strict=True)],
                             spec) for i in range(self.k)]
        fused_why = None if self.fused is not None and all(batched) else self.why_generic or "an input not batched"
        with _kept(self) as restore:
            own = _OwnOutputs(self, inputs, restore)
            for training in ((True, False) if fused_why is None else ()):
                self._set_mode(training)
                try:
                    fused = tree_flatten(self.fused.run(physical, spec))[0]
                except Exception as e:
                    fused_why = f"the fused forward raised {type(e).__name__}: {e}"
                    break
                restore()
                for i in range(self.k):
                    share = member_share(fused, i, fold)
                    why = "its outputs do not fold by member" if share is None else differ(share, own(training, i))
                    if why is not None:
                        fused_why = (f"the fused copy differs from config {self.ids[i]}'s own in "
                                     f"{_MODES[training]} mode: {why}")
                        break
                if fused_why is not None:
                    break
            self.why_generic = fused_why
            if fused_why is None:
                return "fused"
            for training in (True, False):
                self._set_mode(training)
                for i, (args, kwargs) in enumerate(inputs):
                    pack = functional_call(self.base, {n: t[i] for n, t in self.tensors.items()}, args, kwargs)
                    restore()
                    why = differ(tree_flatten(pack)[0], own(training, i))
                    if why is not None:
                        raise PackError(f"config {self.ids[i]}'s own forward differs from the pack's (config "
                                        f"{self.ids[0]}'s module on its weights) on its first batch in "
                                        f"{_MODES[training]} mode: {why}; a plain attribute, a value read in forward "
                                        "or a closure differs")
        return "generic"

    def _set_mode(self, training: bool) -> None:
        for m in (*self.models, self.base, *([self.fused] if self.fused is not None else [])):
            m.train(training)

    def _start_pass(self, configs: Sequence[Mapping[str, Any]], sizes: set[int], refusal: str
                    ) -> tuple[int, _Reads, list[Mapping[str, Any]]]:
        """A pass's start, training or evaluating: the members' one batch size (else `PackError`, "the members'
        " + `refusal` with the sizes), the member check armed for the model's first call (`check`), and what the
        step gets as its config: a `_Reads` of the first member's until the first batch's `_check_reads`, then the
        plain config (the list's one item)."""
        if len(sizes) != 1:
            raise PackError("the members' " + refusal.format(sorted(sizes)))
        reads = _Reads(configs[0])
        self._model.mode = "check"
        return next(iter(sizes)), reads, [reads]

    def train(self, step_fn: Callable, data: Any, configs: Sequence[Mapping[str, Any]], orders: Sequence[torch.Tensor],
              extras: Mapping[str, Any] | None = None, *, lr_schedulers: Sequence[Any] | None = None
              ) -> list[dict[str, float]]:
        """One pass of every member over `data`, member i in the row order `orders[i]` (its unit seed's draw), in
        batches of the members' common `batch_size`; per member: the mean loss and metrics and `num_examples`.
        `lr_schedulers[i]`: member i's LR scheduler (on its own optimizer) to step after every step, as `StepLoop`
        does with a `scheduler_interval` of "step" (None: none; an "epoch" one the worker steps between passes)."""
        size, reads, config = self._start_pass(configs, {batch_size_of(c) for c in configs},
                                               "batch sizes are {}; a pack trains one batch size")
        n, extras, model = data_len(data), dict(extras or {}), self._model
        keys: list[tuple[str, ...]] = []

        def member(rows: Any) -> tuple[torch.Tensor, torch.Tensor]:
            model.level = _ft.current_level()
            loss, metrics = split_output(step_fn(model, rows, config[0], **extras), "step_fn")
            keys.append(("loss", *metrics))
            loss = loss if loss.dim() == 0 else loss.reshape(())
            return loss, torch.stack([_metric("step_fn", "loss", loss),
                                      *(_metric("step_fn", k, v) for k, v in metrics.items())])

        means, params = Means("step_fn", self.k), list(self.params.values())
        lazy_load_decompositions()  # (vmap's batching rules written in Python, e.g. nll_loss's)
        held, device = device_of(data), next(iter(self.params.values())).device  # (data in host memory: moved)
        for j, ids in enumerate(torch.stack(list(orders)).to(held).split(size, dim=1)):
            for p in params:
                p.grad = None
            rows = _rows(data, ids)
            losses, values = _vmap(member, self.k, rows if held == device else to_device(rows, device))
            if j == 0:
                _check_reads(reads, configs)
                config[0] = configs[0]
            losses.sum().backward()
            self.optimizer.step()
            if lr_schedulers:  # each member's own schedule, then the learning rates (momenta, betas) it set
                with warnings.catch_warnings():  # (each member's optimizer did step: stacked, not through its `step`)
                    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
                    for scheduler in filter(None, lr_schedulers):
                        scheduler.step()
                self.optimizer.refresh()
            means.add_members(keys.pop(), values, ids.shape[1])  # (detached: not on backward's path)
        self.path = "fused" if model.mode == "fused" else "generic"
        return means.means(n)

    def evaluate(self, fn: Callable, data: Any, configs: Sequence[Mapping[str, Any]],
                 extras: Mapping[str, Any] | None = None, *, name: str = "step_fn") -> list[dict[str, float]]:
        """Every member's evaluation at once, as `StepLoop.evaluate` runs each alone: `fn` (an `eval_step`, `name`
        "eval_step", whose loss is optional, or the `step_fn`) for all members under vmap and `torch.no_grad()`, the
        model in eval mode and called as in `train` (its path checked on the first batch), over `data` in order, in
        batches of the members' common `eval_batch_size` (default: `batch_size`), every member on the same rows;
        per member: the example-weighted means of its loss (if any) and metrics, and `num_examples`."""
        size, reads, config = self._start_pass(configs, {batch_size_of(c, "eval_batch_size", batch_size_of(c))
                                                         for c in configs},
                                               "evaluation batch sizes are {}; a pack evaluates one batch size")
        n, extras, model = data_len(data), dict(extras or {}), self._model
        keys: list[tuple[str, ...]] = []

        def member(rows: Any) -> tuple[torch.Tensor, torch.Tensor]:
            model.level = _ft.current_level()
            loss, metrics = split_output(fn(model, rows, config[0], **extras), name, need_loss=name != "eval_step")
            named = metrics if loss is None else {"loss": loss, **metrics}
            keys.append(tuple(named))
            values = torch.stack([_metric(name, k, v) for k, v in named.items()]) if named else torch.zeros(0)
            return values, values  # (`_vmap` returns two tensors)

        means = Means(name, self.k)
        nets = [self.base, *([self.fused] if self.fused is not None else [])]
        modes = [(m, m.training) for net in nets for m in net.modules()]
        lazy_load_decompositions()
        held, device = device_of(data), next(iter(self.params.values())).device
        try:
            with torch.no_grad():
                for net in nets:
                    net.eval()
                for j, start in enumerate(range(0, n, size)):
                    ids = torch.arange(start, min(start + size, n), device=held).view(1, -1)
                    rows = _rows(data, ids)  # (1, b, ...): the same rows for every member, expanded (no copy)
                    rows = tree_map(lambda t: t.expand(self.k, *t.shape[1:]),
                                    rows if held == device else to_device(rows, device))
                    _, values = _vmap(member, self.k, rows)
                    if j == 0:
                        _check_reads(reads, configs)
                        config[0] = configs[0]
                    means.add_members(keys.pop(), values, ids.shape[1])
        finally:
            for m, training in modes:
                m.training = training
        self.path = "fused" if model.mode == "fused" else "generic"
        return means.means(n)

    def write_back(self) -> None:
        """Each member's weights, buffers and optimizer state back into its own model and optimizer."""
        with torch.no_grad():
            for i, model in enumerate(self.models):
                for name, t in (*model.named_parameters(), *model.named_buffers()):
                    t.copy_(self.tensors[name][i])
        self.optimizer.write_back()


_MODES = {True: "training", False: "eval"}


class _OwnOutputs:
    """Each member's own module's outputs on its own inputs, per mode, computed once (`own(training, i)`); a forward
    that changes its module's plain attributes raises `PackError`."""

    def __init__(self, pack: FusedPack, inputs: list, restore: Callable[[], None]) -> None:
        self.pack, self.inputs, self.restore, self.done = pack, inputs, restore, {}

    def __call__(self, training: bool, i: int) -> list:
        if (training, i) not in self.done:
            model, (args, kwargs) = self.pack.models[i], self.inputs[i]
            before = plain_attributes(model)
            self.done[training, i] = tree_flatten(model(*args, **kwargs))[0]
            self.restore()
            if plain_attributes(model) != before:
                raise PackError(f"config {self.pack.ids[i]}'s forward changes its module's plain attributes (a "
                                "counter?); a pack runs one copy of the forward, so it trains alone")
        return self.done[training, i]


def _stack_state(models: Sequence[torch.nn.Module]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The members' parameters (leaves that require grad as theirs do) and buffers, each stacked as (k, ...) by
    name. Unlike `torch.func.stack_module_state`, members may be objects of different classes of one shape (a
    class defined inside `model_fn` is a new class per call): the member check vouches for their forwards."""
    named = [dict(m.named_parameters()) for m in models]
    params = {n: torch.stack([p[n].detach() for p in named]).requires_grad_(t.requires_grad)
              for n, t in named[0].items()}
    bufs = [dict(m.named_buffers()) for m in models]
    return params, {n: torch.stack([b[n] for b in bufs]) for n in bufs[0]}


@contextlib.contextmanager
def _kept(pack: FusedPack) -> Any:
    """For the member check: no gradients, vmap's random mode off, random ops deterministic; afterwards every
    module's training mode and every buffer (running statistics, counts) as before, in the pack and the members.
    Yields `restore()`, which puts the buffers back as they were (between forwards: each starts from the same)."""
    modules = [m for model in (*pack.models, pack.base, *([pack.fused] if pack.fused is not None else []))
               for m in model.modules()]
    modes = [(m, m.training) for m in modules]
    buffers = [b for model in pack.models for b in model.buffers()] + [
        t for n, t in pack.tensors.items() if n not in pack.params]
    saved = [b.clone() for b in buffers]

    def restore() -> None:
        with torch.no_grad():
            for b, v in zip(buffers, saved, strict=True):
                b.copy_(v)

    try:
        with torch.no_grad(), torch._C._ExcludeDispatchKeyGuard(_VMAP_MODE), _Deterministic():
            yield restore
    finally:
        restore()
        for m, training in modes:
            m.training = training


def _vmap(fn: Callable, k: int, rows: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.func.vmap(fn, randomness="different")(rows)` over the leading dimension of a tensor (or tuple or dict
    of them), for `fn` that returns two tensors, without vmap's per-call input and output checks."""
    level = _ft._vmap_increment_nesting(k, "different")
    try:
        loss, values = fn(tree_map(lambda t: _ft._add_batch_dim(t, 0, level), rows))
        return _ft._remove_batch_dim(loss, level, k, 0), _ft._remove_batch_dim(values, level, k, 0)
    finally:
        _ft._vmap_decrement_nesting()


def _metric(fn_name: str, key: str, value: Any) -> torch.Tensor:
    """A step's metric (checked: `check_metric`) as a float32 scalar (per member under vmap)."""
    check_metric(fn_name, key, value)
    scalar = torch.is_tensor(value) and value.dim() == 0 and value.dtype == torch.float32
    return value if scalar else torch.as_tensor(value, dtype=torch.float32).reshape(())


def _check_reads(reads: _Reads, configs: Sequence[Mapping[str, Any]]) -> None:
    differ = [key for key in reads.read if len({repr(c.get(key)) for c in configs}) > 1]
    if differ:
        raise PackError(f"step_fn reads config {sorted(differ)}, whose values differ among the members; a pack runs "
                        "the step once for all of them")


def _rows(data: Any, ids: torch.Tensor, flat: torch.Tensor | None = None) -> Any:
    """Every member's batch at once: rows `ids` (k, b) of a partition's tensor (or tuple or dict of them), as
    (k, b, ...) in one gather."""
    flat = ids.reshape(-1) if flat is None else flat
    if isinstance(data, tuple):
        return tuple(_rows(d, ids, flat) for d in data)
    if isinstance(data, dict):
        return {k: _rows(v, ids, flat) for k, v in data.items()}
    rows = take(data, flat)
    if not isinstance(rows, torch.Tensor):
        raise PackError(f"a pack batches partitions of tensors (or tuples or dicts of them), not {type(data).__name__}")
    return rows.view(*ids.shape, *rows.shape[1:])
