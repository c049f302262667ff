"""Fused packs: k configs of one architecture trained at once in one pass (HFTA's horizontal fusion, by `torch.func`).

    pack = FusedPack([t.model for t in trainables], [t.optimizer for t in trainables])
    metrics = pack.train(step_fn, data, configs, seeds, batch_size)   # one pass, every member at once
    pack.write_back()                                                  # into each member's own model and optimizer

The members' parameters are stacked along a leading pack dimension (`torch.func.stack_module_state`), the user's
`step_fn` runs for every member at once under `torch.func.vmap` (the model it gets calls `functional_call` with the
member's slice; `randomness="different"`, so dropout draws per member), the members' losses are summed and one
backward gives each member the gradient of its own loss, and `StackedOptimizer` applies every member's own update
(its learning rate, weight decay, momentum or betas) to the stacked tensors in a few tensor operations. Each member
reads its own batches: the partition's rows in the order its own unit seed draws, as when it trains alone; so a
member ends a pass with the weights it would reach alone, up to float rounding (without dropout, whose draws differ).

The pack exists for one pass: it is built from the members' states and written back into them, so states, hops,
checkpoints and the schedule stay per config, and a member stopped, cloned or added changes only the next pack.

What cannot be packed raises `PackError` naming it (the runner then trains the members one after another):
members whose parameters differ in names, shapes or dtypes; optimizers other than SGD, Adam and AdamW, with more
than one parameter group, `maximize`, `amsgrad` or differing `nesterov`; batch norm that keeps running statistics
(vmap cannot update a buffer per member); LR schedulers and GradScalers (not stacked yet); and a `step_fn` that reads
a config key whose value differs among the members (it runs once for all of them).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.func import functional_call, stack_module_state, vmap

from framework.data import data_len
from framework.engine.steps import batch_size_of, split_output, take

__all__ = ["FusedPack", "PackError", "StackedOptimizer"]


class PackError(ValueError):
    """The members cannot be trained as one fused pack; the message names why."""


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack([t.detach() for t in tensors])


def _per_member(values: Sequence[float], like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """One value per member, shaped to broadcast over a stacked tensor like `like` (k, ...), in `dtype` (default:
    `like`'s)."""
    return torch.tensor(values, dtype=dtype or like.dtype, device=like.device).view(-1, *([1] * (like.dim() - 1)))


class StackedOptimizer:
    """Every member's torch optimizer step, applied at once to stacked parameters. SGD (momentum, dampening,
    nesterov, weight decay) or Adam/AdamW (betas, eps, weight decay), each hyper-parameter one value per member; the
    arithmetic is torch's single-tensor algorithm's, so a member's update equals its own optimizer's up to rounding.

    `params`: the stacked parameters by name; `names[i]`: the parameter names in member i's optimizer order."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], params: Mapping[str, torch.Tensor],
                 names: Sequence[str]) -> None:
        kinds = {type(o) for o in optimizers}
        if len(kinds) != 1 or not issubclass(kinds.pop(), (torch.optim.SGD, torch.optim.Adam)):
            raise PackError(f"the members' optimizers are {sorted({type(o).__name__ for o in optimizers})}; a pack "
                            "stacks SGD, Adam or AdamW, one class for all members")
        self.adam = isinstance(optimizers[0], torch.optim.Adam)
        groups = [o.param_groups for o in optimizers]
        if any(len(g) != 1 for g in groups):
            raise PackError("a member's optimizer has several parameter groups; a pack stacks one group per member")
        hp = [g[0] for g in groups]
        for flag in ("maximize", "amsgrad", "nesterov", "decoupled_weight_decay"):
            if any(h.get(flag, False) for h in hp) and (flag in ("maximize", "amsgrad")
                                                        or len({h.get(flag, False) for h in hp}) > 1):
                raise PackError(f"the members' optimizers set `{flag}` ({[h.get(flag) for h in hp]}), which a pack "
                                "does not stack")
        self.hp, self.names, self.params = hp, list(names), params
        self.optimizers = optimizers
        self._values: dict[tuple, torch.Tensor] = {}  # (parameter, hyper-parameter, dtype) -> per-member values
        self.state: dict[str, dict[str, torch.Tensor]] = {}
        k = len(optimizers)
        for at, name in enumerate(self.names):
            p = params[name]
            members = [o.state.get(o.param_groups[0]["params"][at], {}) for o in optimizers]
            if self.adam:
                self.state[name] = {
                    "exp_avg": _stack([m.get("exp_avg", torch.zeros_like(p[0])) for m in members]),
                    "exp_avg_sq": _stack([m.get("exp_avg_sq", torch.zeros_like(p[0])) for m in members]),
                    "step": torch.tensor([float(m.get("step", 0.0)) for m in members], dtype=torch.float64)}
            else:
                bufs = [m.get("momentum_buffer") for m in members]
                self.state[name] = {"fresh": torch.tensor([b is None for b in bufs]).view(k, *([1] * (p.dim() - 1))),
                                    "momentum_buffer": _stack([b if b is not None else torch.zeros_like(p[0])
                                                               for b in bufs])}

    @torch.no_grad()
    def step(self) -> None:
        for name in self.names:
            p = self.params[name]
            if p.grad is None:
                continue
            (self._adam if self.adam else self._sgd)(name, p, p.grad, self.state[name])

    def _of(self, name: str, key: str, index: int | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The members' values of hyper-parameter `key` (`index` into a tuple such as betas), shaped for the
        stacked parameter `name` (in `dtype`, default the parameter's); made once per pass (a member's
        hyper-parameters do not change within it)."""
        cache = (name, f"{key}{index}", dtype)
        cached = self._values.get(cache)
        if cached is None:
            values = [h[key] if index is None else h[key][index] for h in self.hp]
            cached = self._values[cache] = _per_member(values, self.params[name], dtype)
        return cached

    def _sgd(self, name: str, p: torch.Tensor, g: torch.Tensor, s: dict[str, torch.Tensor]) -> None:
        lr, wd, mom, damp = (self._of(name, key) for key in ("lr", "weight_decay", "momentum", "dampening"))
        g = g + wd * p
        buf = torch.where(s["fresh"], g, s["momentum_buffer"] * mom + (1 - damp) * g)
        s["momentum_buffer"], s["fresh"] = buf, torch.zeros_like(s["fresh"])
        step = g + mom * buf if self.hp[0].get("nesterov") else buf
        p.sub_(lr * torch.where(mom != 0, step, g))

    def _adam(self, name: str, p: torch.Tensor, g: torch.Tensor, s: dict[str, torch.Tensor]) -> None:
        hp = self.hp
        lr, wd, eps = (self._of(name, key) for key in ("lr", "weight_decay", "eps"))
        b1, b2 = self._of(name, "betas", 0), self._of(name, "betas", 1)
        s["step"] += 1
        if hp[0].get("decoupled_weight_decay") or isinstance(self.optimizers[0], torch.optim.AdamW):
            p.mul_(1 - lr * wd)
        else:
            g = g + wd * p
        s["exp_avg"].lerp_(g, 1 - b1)
        s["exp_avg_sq"].mul_(b2).addcmul_(g, g * (1 - b2))
        steps = s["step"].view(-1, *([1] * (p.dim() - 1)))
        bc1 = (1 - self._of(name, "betas", 0, torch.float64) ** steps).to(p.dtype)
        bc2 = (1 - self._of(name, "betas", 1, torch.float64) ** steps).to(p.dtype)
        denom = (s["exp_avg_sq"].sqrt() / bc2.sqrt()).add_(eps)
        p.sub_((lr / bc1) * s["exp_avg"] / denom)

    def write_back(self) -> None:
        """Each member's slice of the stacked state into its own torch optimizer's state (torch's own format)."""
        for i, opt in enumerate(self.optimizers):
            for name, param in zip(self.names, opt.param_groups[0]["params"], strict=True):
                s = self.state[name]
                if self.adam:
                    opt.state[param] = {"step": torch.tensor(float(s["step"][i])),
                                        "exp_avg": s["exp_avg"][i].clone(), "exp_avg_sq": s["exp_avg_sq"][i].clone()}
                elif self.hp[i]["momentum"] != 0 and not bool(s["fresh"][i].all()):
                    opt.state[param] = {"momentum_buffer": s["momentum_buffer"][i].clone()}


class _MemberModel:
    """What `step_fn` gets as its model inside the pack's vmap: a call runs the shared architecture with this
    member's parameters; attributes are the architecture's (on the meta device: read, never computed with)."""

    def __init__(self, base: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
        self._base, self._weights = base, weights

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return functional_call(self._base, self._weights, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


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


class FusedPack:
    """k members' models and optimizers as one stacked model for one pass (see the module docstring)."""

    def __init__(self, models: Sequence[torch.nn.Module], optimizers: Sequence[torch.optim.Optimizer]) -> None:
        signatures = {tuple((n, tuple(t.shape), t.dtype) for n, t in (*m.named_parameters(), *m.named_buffers()))
                      for m in models}
        if len(signatures) != 1:
            raise PackError("the members' models differ in their parameters' names, shapes or dtypes; a pack "
                            "stacks one architecture")
        for name, module in models[0].named_modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
                raise PackError(f"module {name!r} ({type(module).__name__}) keeps running statistics, which a pack "
                                "cannot update per member yet")
        self.models, self.k = list(models), len(models)
        params, buffers = stack_module_state(self.models)
        self.params = {n: p.detach().requires_grad_(p.requires_grad) for n, p in params.items()}
        self.buffers = buffers
        self.base = copy.deepcopy(self.models[0]).to("meta")
        names_of = [{id(p): n for n, p in m.named_parameters()} for m in self.models]
        orders = [[names_of[i][id(p)] for p in opt.param_groups[0]["params"]] for i, opt in enumerate(optimizers)]
        if len({tuple(o) for o in orders}) != 1:
            raise PackError("the members' optimizers hold their parameters in different orders")
        self.optimizer = StackedOptimizer(optimizers, self.params, orders[0])

    def train(self, step_fn: Callable, data: Any, configs: Sequence[Mapping[str, Any]], orders: Sequence[torch.Tensor],
              extras: Mapping[str, Any] | None = None) -> list[dict[str, float]]:
        """One pass of every member over `data`, member i in the row order `orders[i]` (its unit seed's draw), in
        batches of the members' common `batch_size`; per member: the mean loss and metrics and `num_examples`."""
        batch = {batch_size_of(c) for c in configs}
        if len(batch) != 1:
            raise PackError(f"the members' batch sizes are {sorted(batch)}; a pack trains one batch size")
        size, n = batch.pop(), data_len(data)
        config = _Reads(configs[0])
        chunks = torch.stack(list(orders)).split(size, dim=1)  # step j: (k, rows) row ids, member i's in row i

        def member(weights: dict, buffers: dict, rows: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            model = _MemberModel(self.base, {**weights, **buffers})
            loss, metrics = split_output(step_fn(model, rows, config, **(extras or {})), "step_fn")
            return loss.reshape(()), {k: torch.as_tensor(v, dtype=torch.float32) for k, v in metrics.items()}

        run = vmap(member, randomness="different")
        sums: dict[str, torch.Tensor] = {}
        for j, ids in enumerate(chunks):
            rows = _rows(data, ids)
            for p in self.params.values():
                p.grad = None
            losses, metrics = run(self.params, self.buffers, rows)
            losses.sum().backward()
            self.optimizer.step()
            m = ids.shape[1]
            for key, values in {"loss": losses, **metrics}.items():
                sums[key] = sums.get(key, 0.0) + values.detach().double() * m
            if j == 0:
                differ = [key for key in config.read if len({repr(c.get(key)) for c in configs}) > 1]
                if differ:
                    raise PackError(f"step_fn reads config {sorted(differ)}, whose values differ among the members; a "
                                    "pack runs the step once for all of them")
        return [{**{key: float(v[i]) / n for key, v in sums.items()}, "num_examples": n} for i in range(self.k)]

    def write_back(self) -> None:
        """Each member's weights and optimizer state back into its own model and optimizer."""
        with torch.no_grad():
            for i, model in enumerate(self.models):
                for name, p in model.named_parameters():
                    p.copy_(self.params[name][i])
        self.optimizer.write_back()


def _rows(data: Any, ids: torch.Tensor) -> Any:
    """Every member's batch at once: rows `ids` (k, b) of a partition's tensor (or tuple or dict of them), as
    (k, b, ...) in one gather."""
    if isinstance(data, tuple):
        return tuple(_rows(d, ids) for d in data)
    if isinstance(data, dict):
        return {k: _rows(v, ids) for k, v in data.items()}
    rows = take(data, ids.reshape(-1).to(data.device) if isinstance(data, torch.Tensor) else ids.reshape(-1))
    if not isinstance(rows, torch.Tensor):
        raise PackError(f"a pack batches partitions of tensors (or tuples or dicts of them), not {type(data).__name__}")
    return rows.view(*ids.shape, *rows.shape[1:])
