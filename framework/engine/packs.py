"""Fused packs: k configs of one architecture trained at once in one pass (HFTA's horizontal fusion).

    pack = FusedPack([t.model for t in trainables], [t.optimizer for t in trainables])
    metrics = pack.train(step_fn, data, configs, orders)   # one pass, every member at once
    pack.write_back()                                       # into each member's own model and optimizer

The members' parameters and buffers are stacked along a leading pack dimension (`stack_module_state`); the user's
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
a config key whose value differs among them (it runs once for all). LR schedulers and GradScalers are not stacked.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import torch
from torch._C import _functorch as _ft
from torch._functorch.vmap import lazy_load_decompositions
from torch.func import functional_call, stack_module_state
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._pytree import tree_flatten, tree_map

from framework.data import data_len
from framework.engine.fused_modules import fuse
from framework.engine.steps import batch_size_of, device_of, split_output, take, to_device
from framework.trainable import Trainable

__all__ = ["pack_key", "FusedPack", "PackError", "StackedOptimizer", "signature"]

_FLAGS = ("maximize", "amsgrad", "nesterov", "decoupled_weight_decay")


class PackError(ValueError):
    """The members cannot be trained as one fused pack; the message names why."""


def signature(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple:
    """What configs must share to train in one pack (hashable): their parameters' and buffers' names, shapes, dtypes
    and devices, the model's repr (its modules and their settings: an activation or dropout rate that differs makes
    another architecture), and the optimizer's class and flags."""
    tensors = tuple((n, tuple(t.shape), t.dtype, str(t.device))
                    for n, t in (*model.named_parameters(), *model.named_buffers()))
    flags = tuple(tuple(bool(g.get(f, False)) for f in _FLAGS) for g in optimizer.param_groups)
    return tensors, repr(model), type(optimizer), flags


def pack_key(model_fn: Callable) -> Callable[[Mapping[str, Any]], Hashable | None]:
    """`key(config)`: what configs of one pack share (`ModelSelection(pack=...)`, the driver's packer): the
    `signature` of what `model_fn` builds, and the batch size. The model is built on PyTorch's meta device (no
    memory, no weights); None, a config that trains alone, where that fails or it has an LR scheduler or a
    GradScaler (not stacked yet) or no optimizer."""

    def key(config: Mapping[str, Any]) -> Hashable | None:
        try:
            with torch.device("meta"):
                built = Trainable.of(model_fn(dict(config)))
        except Exception:  # e.g. a model_fn that loads weights from a file: the worker builds it for real
            return None
        if built.optimizer is None or built.lr_scheduler is not None or built.grad_scaler is not None:
            return None
        return signature(built.model, built.optimizer), repr(config.get("batch_size"))

    return key


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
        for flag in _FLAGS:
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

    def _value(self, key: str, f: Callable[[dict], float] | None = None) -> float | list[torch.Tensor]:
        """The members' `key` (or `f(param_group)`): a float when all members share it, else per-member tensors."""
        return self._values([[float(f(h) if f else h[key]) for h in self.hp]] * len(self.params))

    def _values(self, rows: Sequence[Sequence[float]]) -> float | list[torch.Tensor]:
        """rows[j][i]: member i's value for parameter j; a float when all are equal, else one tensor per param."""
        if len({v for r in rows for v in r}) == 1:
            return float(rows[0][0])
        return [_per_member(r, p) for r, p in zip(rows, self.params, strict=True)]

    def _init_sgd(self, states: list[list[dict]]) -> None:
        mom = [float(h["momentum"]) for h in self.hp]
        self.neg_lr, self.nesterov = self._value("", lambda h: -h["lr"]), bool(self.hp[0].get("nesterov"))
        self.wd = self._value("weight_decay") if any(h["weight_decay"] for h in self.hp) else None
        self.bufs = None
        if any(mom):  # buf = momentum*buf + c*grad; a member without momentum keeps buf = grad (c = 1)
            self.mom = self._value("momentum")
            self.c = self._value("", lambda h: 1 - h["dampening"] if h["momentum"] else 1.0)
            fresh = [[s.get("momentum_buffer") is None for s in row] for row in states]
            # a fresh buffer (torch: the first step's gradient itself) is zeros here, taking c = 1 on its first step
            damped = any(f and h["dampening"] and h["momentum"] for fr in fresh for f, h in zip(fr, self.hp))
            self.c0 = self._values([[1.0 if f else (1 - h["dampening"] if h["momentum"] else 1.0)
                                     for f, h in zip(fr, self.hp, strict=True)] for fr in fresh]) if damped else self.c
            self.bufs = [_stack([torch.zeros_like(p[0]) if f else s["momentum_buffer"] for s, f in zip(row, fr)], p)
                         for row, fr, p in zip(states, fresh, self.params, strict=True)]

    def _init_adam(self, states: list[list[dict]]) -> None:
        k, like = len(self.hp), self.params[0]
        self.decoupled = isinstance(self.optimizers[0], torch.optim.AdamW) or bool(
            self.hp[0].get("decoupled_weight_decay"))
        decay = any(h["weight_decay"] for h in self.hp)
        self.wd = self._value("weight_decay") if decay and not self.decoupled else None
        self.shrink = self._value("", lambda h: 1 - h["lr"] * h["weight_decay"]) if decay and self.decoupled else None
        self.b1c, self.b2 = self._value("", lambda h: 1 - h["betas"][0]), self._value("", lambda h: h["betas"][1])
        self.b2c, self.eps = self._value("", lambda h: 1 - h["betas"][1]), self._value("eps")
        as64 = {"dtype": torch.float64, "device": like.device}
        self.lr64, self.b1_64, self.b2_64 = (torch.tensor([float(f(h)) for h in self.hp], **as64) for f in (
            lambda h: h["lr"], lambda h: h["betas"][0], lambda h: h["betas"][1]))
        self.steps = torch.tensor([[float(s.get("step", 0.0)) for s in row] for row in states], **as64)  # (P, k)
        self.uniform = bool((self.steps == self.steps[0]).all())  # (every parameter at the same step counts)
        self.exp_avg, self.exp_avg_sq = ([_stack([s.get(key, torch.zeros_like(p[0])) for s in row], p)
                                          for row, p in zip(states, self.params, strict=True)]
                                         for key in ("exp_avg", "exp_avg_sq"))
        self.shapes = [(k, *([1] * (p.dim() - 1))) for p in self.params]

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
    computed with). `mode`: "check" (fused, checked against the members alone), "fused" or "generic"."""

    def __init__(self, pack: FusedPack) -> None:
        self._pack, self.level, self.mode = pack, 0, "generic"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pack = self._pack
        if self.mode != "generic":
            leaves, spec = (args, None) if len(args) == 1 and not kwargs else tree_flatten((args, kwargs))
            physical = self._unwrap(leaves)
            if physical is not None:
                if self.mode == "fused" or pack.fused.agrees(physical, spec, pack.base, pack.tensors):
                    out = pack.fused.run(physical, spec)
                    return self._wrap(out) if torch.is_tensor(out) else tree_map(self._wrap, out)
                self.mode = "generic"
        weights = {n: _ft._add_batch_dim(t, 0, self.level) for n, t in pack.tensors.items()}
        with pack.attention():  # (on a CPU, attention's math kernel: vmap loops over members for the fused one)
            return functional_call(pack.base, weights, args, kwargs)

    def _unwrap(self, leaves: list) -> list | None:
        """The inputs' physical (k, B, ...) tensors, or None when one is not batched over the members."""
        out = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                if _ft.maybe_get_level(x) != self.level or x.dim() == 0:
                    return None
                x = _ft._remove_batch_dim(x, self.level, self._pack.k, 0)
            out.append(x)
        return out

    def _wrap(self, y: Any) -> Any:
        fold = self._pack.fused.fold
        return _ft._add_batch_dim(fold.split(y), fold.dim, self.level) if torch.is_tensor(y) else y

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pack.base, name)


class FusedPack:
    """k members' models and optimizers as one stacked model for one pass (see the module docstring). `generic`:
    never take the fused path (for comparisons). `path`: the path the last pass took ("fused" or "generic")."""

    def __init__(self, models: Sequence[torch.nn.Module], optimizers: Sequence[torch.optim.Optimizer], *,
                 generic: bool = False) -> None:
        if not models or len(models) != len(optimizers):
            raise PackError(f"a pack needs one optimizer per model, got {len(models)} models, {len(optimizers)}")
        signatures = [signature(m, o) for m, o in zip(models, optimizers, strict=True)]
        if len({s[0] for s in signatures}) != 1:
            raise PackError("the members' models differ in their parameters' names, shapes or dtypes; a pack "
                            "stacks one architecture")
        if len({s[1] for s in signatures}) != 1:
            raise PackError("the members' models differ in their modules (their repr: an activation, a dropout "
                            "rate); a pack runs one architecture's forward")
        self.models, self.k = list(models), len(models)
        params, buffers = stack_module_state(self.models)
        self.params = {n: p.detach().requires_grad_(p.requires_grad) for n, p in params.items()}
        self.tensors = {**self.params, **buffers}
        self.base = copy.deepcopy(self.models[0]).to("meta")
        self.fused = None if generic else fuse(self.models[0], self.k, self.tensors)
        self.params = {n: self.tensors[n] for n in self.params}  # (as `fuse` laid them out)
        self.path = "generic" if self.fused is None else "fused"
        names_of = [{id(p): n for n, p in m.named_parameters()} for m in self.models]
        try:
            orders = [[names_of[i][id(p)] for p in o.param_groups[0]["params"]] for i, o in enumerate(optimizers)]
        except KeyError:
            raise PackError("a member's optimizer holds a tensor that is not its model's parameter") from None
        if len({tuple(o) for o in orders}) != 1:
            raise PackError("the members' optimizers hold their parameters in different orders")
        self.optimizer = StackedOptimizer(optimizers, self.params, orders[0])
        self._model = _PackModel(self)
        on_cpu = all(t.device.type == "cpu" for t in self.tensors.values())
        self.attention = (lambda: sdpa_kernel([SDPBackend.MATH])) if on_cpu else contextlib.nullcontext

    def train(self, step_fn: Callable, data: Any, configs: Sequence[Mapping[str, Any]], orders: Sequence[torch.Tensor],
              extras: Mapping[str, Any] | None = None) -> list[dict[str, float]]:
        """One pass of every member over `data`, member i in the row order `orders[i]` (its unit seed's draw), in
        batches of the members' common `batch_size`; per member: the mean loss and metrics and `num_examples`."""
        batch = {batch_size_of(c) for c in configs}
        if len(batch) != 1:
            raise PackError(f"the members' batch sizes are {sorted(batch)}; a pack trains one batch size")
        size, n, extras = batch.pop(), data_len(data), dict(extras or {})
        model, reads = self._model, _Reads(configs[0])
        model.mode = "generic" if self.fused is None else "check"
        config: list[Mapping[str, Any]] = [reads]  # (the plain config after the first step's check)
        keys: list[tuple[str, ...]] = []

        def member(rows: Any) -> tuple[torch.Tensor, torch.Tensor]:
            model.level = _ft.current_level()
            loss, metrics = split_output(step_fn(model, rows, config[0], **extras), "step_fn")
            keys.append(("loss", *metrics))
            loss = loss if loss.dim() == 0 else loss.reshape(())
            return loss, torch.stack([_metric("loss", loss), *(_metric(k, v) for k, v in metrics.items())])

        log, params = [], list(self.params.values())
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
            log.append((keys.pop(), values.detach(), ids.shape[1]))  # (values: not on backward's path)
            if model.mode == "check":
                model.mode = "fused"
        self.path = "fused" if model.mode == "fused" else "generic"
        return _means(log, self.k, n)

    def write_back(self) -> None:
        """Each member's weights, buffers and optimizer state back into its own model and optimizer."""
        with torch.no_grad():
            for i, model in enumerate(self.models):
                for name, t in (*model.named_parameters(), *model.named_buffers()):
                    t.copy_(self.tensors[name][i])
        self.optimizer.write_back()


def _vmap(fn: Callable, k: int, rows: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.func.vmap(fn, randomness="different")(rows)` over the leading dimension of a tensor (or tuple or dict
    of them), for `fn` that returns two tensors, without vmap's per-call input and output checks."""
    level = _ft._vmap_increment_nesting(k, "different")
    try:
        loss, values = fn(tree_map(lambda t: _ft._add_batch_dim(t, 0, level), rows))
        return _ft._remove_batch_dim(loss, level, k, 0), _ft._remove_batch_dim(values, level, k, 0)
    finally:
        _ft._vmap_decrement_nesting()


def _metric(key: str, value: Any) -> torch.Tensor:
    """A step's metric as a float32 scalar (per member under vmap)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise TypeError(f"step_fn returned metric {key!r} = {value!r}, which is not a number")
    if torch.is_tensor(value) and value.numel() != 1:
        raise TypeError(f"step_fn returned metric {key!r} as a tensor of shape {tuple(value.shape)}, but a metric "
                        "must be one number (the batch's mean)")
    scalar = torch.is_tensor(value) and value.dim() == 0 and value.dtype == torch.float32
    return value if scalar else torch.as_tensor(value, dtype=torch.float32).reshape(())


def _check_reads(reads: _Reads, configs: Sequence[Mapping[str, Any]]) -> None:
    differ = [key for key in reads.read if len({repr(c.get(key)) for c in configs}) > 1]
    if differ:
        raise PackError(f"step_fn reads config {sorted(differ)}, whose values differ among the members; a pack runs "
                        "the step once for all of them")


def _means(log: list[tuple[tuple[str, ...], torch.Tensor, int]], k: int, n: int) -> list[dict[str, float]]:
    """Per member, the example-weighted means of its steps' values (one sync for the pass)."""
    out: list[dict[str, float]] = [{} for _ in range(k)]
    for keys in dict.fromkeys(keys for keys, _, _ in log):  # (the same keys every step, as a rule)
        steps = [(values, rows) for ks, values, rows in log if ks == keys]
        stacked = torch.stack([values for values, _ in steps]).double()  # (steps, k, len(keys))
        weights = torch.tensor([rows for _, rows in steps], dtype=torch.float64, device=stacked.device)
        for i, sums in enumerate((stacked * weights.view(-1, 1, 1)).sum(0).tolist()):
            for key, s in zip(keys, sums, strict=True):
                out[i][key] = out[i].get(key, 0.0) + s
    return [{**{key: s / n for key, s in o.items()}, "num_examples": n} for o in out]


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
