"""Model fusion (Nautilus Algorithm 1, section 4.3) and fused training.

``fuse_models`` greedily merges the pair of groups (same batch size, same epochs) with the largest cost reduction
``C(i) + C(j) - C(i,j)`` whose estimated peak memory fits ``memory_budget``, until no pair fits or helps. To keep the
O(n^3) pair evaluations cheap, a candidate pair is scored with the union of the two groups' reuse plans (shared
layers counted once, a feasible fused plan); the chosen pair is then re-planned exactly with the fixed-V MILP
(section 4.3.2), keeping the union plan if the MILP plan does not fit the memory budget.

``FusedTrainer`` trains a group: per mini-batch the shared frozen bridge runs once (no grad), every member's
trainable branch runs on its outputs, one backward over the sum of the members' losses (their parameters are
disjoint, so each gets exactly its own gradient), one optimizer per branch. Each member keeps its own RNG stream
(dropout), so a fused member follows the same trajectory as the member trained alone on the same batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from framework.planner.execution import KeyedModule
from framework.planner.memory import estimate_peak_memory
from framework.planner.milp import COMPUTE, LOAD, PRUNE, CostModel, ReusePlan, compute_cost, solve_reuse, units_for
from framework.planner.multimodel import MultiModelGraph


@dataclass(frozen=True)
class FusedGroup:
    """Models trained together, their fused reuse plan, and its estimated peak memory in bytes."""

    members: tuple[int, ...]
    plan: ReusePlan
    memory_bytes: int

    @property
    def loaded(self) -> list[str]:
        return self.plan.keys(LOAD)


def _plan_cost(mm: MultiModelGraph, actions: dict[str, str], cost_model: CostModel) -> float:
    cost = 0.0
    for k, a in actions.items():
        if a == COMPUTE:
            cost += compute_cost(mm.layers[k])
        elif a == LOAD:
            cost += cost_model.load_cost(mm.layers[k].out_bytes)
    return cost


def _union(mm: MultiModelGraph, a: ReusePlan, b: ReusePlan, cost_model: CostModel) -> ReusePlan:
    rank = {PRUNE: 0, LOAD: 1, COMPUTE: 2}
    actions = dict(a.actions)
    for k, act in b.actions.items():
        if k not in actions or rank[act] > rank[actions[k]]:
            actions[k] = act
    # a layer now computed no longer needs loading if all its inputs are present
    return ReusePlan(actions, _plan_cost(mm, actions, cost_model))


def fuse_models(
    mm: MultiModelGraph,
    materialized: Sequence[str],
    cost_model: CostModel,
    *,
    batch_sizes: Sequence[int],
    epochs: Sequence[int],
    memory_budget: float,
    workspace_bytes: int = 0,
) -> list[FusedGroup]:
    """Algorithm 1 FUSEMODELS(Q, B_mem, V). Returns groups covering every model exactly once."""
    n = len(mm.models)
    if len(batch_sizes) != n or len(epochs) != n:
        raise ValueError(
            f"`batch_sizes` has {len(batch_sizes)} and `epochs` {len(epochs)} entries, but there are {n} models"
        )
    if not isinstance(memory_budget, (int, float)) or math.isnan(memory_budget) or memory_budget <= 0:
        raise ValueError(f"`memory_budget` is {memory_budget!r}, but must be a positive number of bytes")
    single = solve_reuse(mm, units_for(mm, [[i] for i in range(n)], epochs), cost_model, records=1, fixed=materialized)
    groups = [
        FusedGroup((i,), p, estimate_peak_memory(mm, p, batch_sizes[i], workspace_bytes=workspace_bytes))
        for i, p in enumerate(single.reuse)
    ]
    rejected: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    while True:
        best = None
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                ga, gb = groups[a], groups[b]
                i, j = ga.members[0], gb.members[0]
                if batch_sizes[i] != batch_sizes[j] or epochs[i] != epochs[j] or (ga.members, gb.members) in rejected:
                    continue
                fused = _union(mm, ga.plan, gb.plan, cost_model)
                gain = ga.plan.cost + gb.plan.cost - fused.cost
                if gain <= 0:
                    rejected.add((ga.members, gb.members))
                    continue
                mem = estimate_peak_memory(mm, fused, batch_sizes[i], workspace_bytes=workspace_bytes)
                if mem > memory_budget:
                    rejected.add((ga.members, gb.members))
                    continue
                if best is None or gain > best[0]:
                    best = (gain, a, b, fused, mem)
        if best is None:
            return sorted(groups, key=lambda g: g.members)
        _, a, b, fused, mem = best
        members = tuple(sorted(groups[a].members + groups[b].members))
        exact = solve_reuse(mm, units_for(mm, [members], epochs), cost_model, records=1, fixed=materialized).reuse[0]
        exact_mem = estimate_peak_memory(mm, exact, batch_sizes[members[0]], workspace_bytes=workspace_bytes)
        if exact.cost <= fused.cost and exact_mem <= memory_budget:
            fused, mem = exact, exact_mem
        groups = [g for t, g in enumerate(groups) if t not in (a, b)] + [FusedGroup(members, fused, mem)]


class FusedTrainer:
    """Trains the branches of one fused group on shared mini-batches (see module docstring)."""

    def __init__(
        self,
        bridge: KeyedModule,
        branches: Sequence[KeyedModule],
        optimizers: Sequence[torch.optim.Optimizer],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        seeds: Sequence[int],
    ) -> None:
        if not (len(branches) == len(optimizers) == len(seeds)):
            raise ValueError(
                f"`branches`, `optimizers` and `seeds` have {len(branches)}, {len(optimizers)} and {len(seeds)} "
                "entries, but must have one per member"
            )
        self.bridge, self.branches, self.optimizers, self.loss_fn = bridge, list(branches), list(optimizers), loss_fn
        self._rng = []
        for s in seeds:
            g = torch.Generator().manual_seed(int(s))
            self._rng.append(g.get_state())
        self.bridge.eval()

    def _with_rng(self, i: int, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        outer = torch.get_rng_state()
        torch.set_rng_state(self._rng[i])
        try:
            return fn()
        finally:
            self._rng[i] = torch.get_rng_state()
            torch.set_rng_state(outer)

    def boundary(self, features: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return dict(zip(self.bridge.output_keys, self.bridge(*features), strict=True))

    def step(
        self, features: Sequence[torch.Tensor], target: torch.Tensor, active: Sequence[bool] | None = None
    ) -> list[float]:
        """One SGD step of every active member on one mini-batch; returns the members' losses (nan if inactive)."""
        bnd = self.boundary(features)
        losses: list[torch.Tensor | None] = []
        for i, br in enumerate(self.branches):
            if active is not None and not active[i]:
                losses.append(None)
                continue
            br.train()
            out = self._with_rng(i, lambda br=br: br(*(bnd[k] for k in br.input_keys))[0])
            losses.append(self.loss_fn(out, target))
        live = [loss for loss in losses if loss is not None]
        for i, opt in enumerate(self.optimizers):
            if losses[i] is not None:
                opt.zero_grad(set_to_none=True)
        if live:
            torch.stack(live).sum().backward()
        for i, opt in enumerate(self.optimizers):
            if losses[i] is not None:
                opt.step()
        return [float(loss.detach()) if loss is not None else math.nan for loss in losses]

    @torch.no_grad()
    def predict(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        bnd = self.boundary(features)
        outs = []
        for br in self.branches:
            br.eval()
            outs.append(br(*(bnd[k] for k in br.input_keys))[0])
        return outs


def parameters_of(branch: nn.Module) -> list[nn.Parameter]:
    return [p for p in branch.parameters() if p.requires_grad]
