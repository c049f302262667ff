"""Materialization optimization (Nautilus section 4.2, equations 9-10) and the FLOPs-optimal bound (equation 11).

Costs are FLOPs per record. ``c_comp`` is 1x / 2x / 3x the forward FLOPs for a materializable / frozen (not
materializable) / trainable layer. ``c_load`` is the disk read time of the layer's output, converted to missed FLOPs
with the machine's compute throughput. Input layers are always "materialized" (they are the stored records): they
are loaded at the input's load cost and do not count against the storage budget.

The MILP is written over *units*: a unit is one model, or a fused group of models whose shared layers appear once
(section 4.3.2 reuses the same program with the set of materialized layers fixed). Constraint (c) is written per
parent (a computed layer needs *every* input present). Solved with OR-Tools (SCIP, or CP-SAT as a fall-back); no
commercial solver. The solve is bounded by deterministic work (``time_limit_s`` reference seconds of it, see
``framework.scheduling.milp.bound_mip_by_work``), so the same graphs give the same plan on any machine under any load;
a wall-clock limit remains only as a safety stop, and a plan it cut short says so (``MaterializationPlan.status``).
``exhaustive_materialization`` solves the same problem by enumeration, to check the MILP on small graphs.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from ortools.linear_solver import pywraplp

from framework.planner.multimodel import MultiModelGraph
from framework.planner.profile import LayerNode
from framework.scheduling.milp import bound_mip_by_work, mip_wall_stopped

PRUNE, COMPUTE, LOAD = "prune", "compute", "load"
#: how a plan's solve ended: proven optimal; stopped by its deterministic budget; stopped by the wall-clock safety
#: stop (the plan then depends on the machine's speed)
OPTIMAL, FEASIBLE, WALL_STOP = "optimal", "feasible", "wall_stop"


def _check_positive(name: str, value: float, *, allow_inf: bool = False) -> None:
    if not isinstance(value, (int, float)) or math.isnan(value) or value <= 0 or (math.isinf(value) and not allow_inf):
        raise ValueError(f"`{name}` is {value!r}, but must be a positive finite number")


def check_disk_budget(disk_budget: float) -> None:
    """A ValueError unless `disk_budget` is a number of bytes >= 0 (inf: no budget; 0: nothing is stored)."""
    if not isinstance(disk_budget, (int, float)) or math.isnan(disk_budget) or disk_budget < 0:
        raise ValueError(f"`disk_budget` is {disk_budget!r}, but must be a number >= 0 (bytes)")


@dataclass(frozen=True)
class CostModel:
    """Machine throughputs: compute in FLOP/s, disk (feature store) reads in bytes/s; inf disk = free loads."""

    flops_per_s: float
    disk_bytes_per_s: float

    def __post_init__(self) -> None:
        _check_positive("flops_per_s", self.flops_per_s)
        _check_positive("disk_bytes_per_s", self.disk_bytes_per_s, allow_inf=True)

    def load_cost(self, nbytes: float) -> float:
        """Missed FLOPs while reading ``nbytes``."""
        return nbytes / self.disk_bytes_per_s * self.flops_per_s

    def seconds(self, flops: float) -> float:
        return flops / self.flops_per_s


def measure_read_bandwidth(
    nbytes: int = 1 << 25, *, directory: str | None = None, repeats: int = 3
) -> tuple[float, str]:
    """Storage read throughput in bytes/s, not the page cache's, and how it was measured.

    Writes ``nbytes`` of random bytes to a temporary file in ``directory`` (default: the system temp folder; pass the
    feature store's folder to measure its disk), ``fsync``s them, then per repeat drops the file's pages from the
    page cache and reads it back sequentially in 1 MiB chunks; returns the median. Reading a file just written
    without dropping its pages times memory (several GB/s), which would make every load look free.

    Methods, first that works: ``"fadvise"`` (``posix_fadvise(POSIX_FADV_DONTNEED)`` after ``fsync``, Linux and
    most Unix: clean pages of the file are evicted, so the read goes to the device), ``"o_direct"`` (``O_DIRECT``
    reads, bypassing the cache, where fadvise is missing), ``"cached"`` (neither exists, e.g. Windows: the number is
    the page cache's and the caller should say so or pass a measured ``disk_bytes_per_s``). On a virtual machine the
    "device" may itself be cached by the host; on tmpfs there is no device and the number is memory's.
    """
    import tempfile

    if not isinstance(nbytes, int) or nbytes < 1 << 20:
        raise ValueError(f"`nbytes` is {nbytes!r}, but must be an int >= 1 MiB (1048576)")
    method = "fadvise" if hasattr(os, "posix_fadvise") else ("o_direct" if hasattr(os, "O_DIRECT") else "cached")
    chunk = 1 << 20
    fd, path = tempfile.mkstemp(prefix="readbw-", dir=directory)
    try:
        block = os.urandom(chunk)  # random: nothing on the way can compress it
        for _ in range(nbytes // chunk):
            os.write(fd, block)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        total = (nbytes // chunk) * chunk
        times = []
        for _ in range(repeats):
            flags = os.O_RDONLY | (os.O_DIRECT if method == "o_direct" else 0)
            rfd = os.open(path, flags)
            try:
                if method == "fadvise":
                    os.posix_fadvise(rfd, 0, 0, os.POSIX_FADV_DONTNEED)
                buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT requires
                t0 = time.perf_counter()
                while os.readv(rfd, [buf]) > 0:
                    pass
                times.append(time.perf_counter() - t0)
            finally:
                os.close(rfd)
        return total / max(float(np.median(times)), 1e-9), method
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(path)


def measure_compute_throughput(size: int = 256, reps: int = 10, repeats: int = 5) -> float:
    """FLOP/s of a float32 ``size`` x ``size`` matmul on this process's torch threads: the median of ``repeats``
    timings of ``reps`` products each (the median, because a machine shared with other work is noisy)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        times.append(time.perf_counter() - t0)
    return 2 * size**3 * reps / max(float(np.median(times)), 1e-9)


def measure_cost_model(
    *,
    flops_per_s: float | None = None,
    disk_bytes_per_s: float | None = None,
    size: int = 256,
    nbytes: int = 1 << 25,
    directory: str | None = None,
) -> CostModel:
    """Measure compute throughput (``measure_compute_throughput``) and storage reads with the page cache dropped
    (``measure_read_bandwidth``, in ``directory``); arguments override. Takes well under 2 s."""
    if flops_per_s is None:
        flops_per_s = measure_compute_throughput(size)
    if disk_bytes_per_s is None:
        disk_bytes_per_s, _ = measure_read_bandwidth(nbytes, directory=directory)
    return CostModel(float(flops_per_s), float(disk_bytes_per_s))


def compute_cost(node: LayerNode) -> float:
    """c_comp: forward FLOPs x 1 (materializable), 2 (frozen: forward + input gradient), 3 (trainable)."""
    if node.op == "placeholder":
        return 0.0
    mult = 1.0 if node.materializable else (2.0 if node.frozen else 3.0)
    return mult * node.flops


def flops_optimal_speedup(mm: MultiModelGraph, epochs: Sequence[int]) -> float:
    """Equation 11: total training cost over the cost of the non-materializable layers only."""
    if len(epochs) != len(mm.models):
        raise ValueError(f"`epochs` has {len(epochs)} entries, but there are {len(mm.models)} models")
    total = nonmat = 0.0
    for g, e in zip(mm.models, epochs, strict=True):
        for node in g.nodes.values():
            c = compute_cost(node) * e
            total += c
            nonmat += 0.0 if node.materializable else c
    return total / nonmat if nonmat > 0 else math.inf


@dataclass(frozen=True)
class ReusePlan:
    """Actions of one unit (a model or a fused group): key -> prune / compute / load, and its cost per record."""

    actions: Mapping[str, str]
    cost: float  # FLOPs per record per epoch (equation 5)

    def keys(self, action: str) -> list[str]:
        return [k for k, a in self.actions.items() if a == action]


@dataclass(frozen=True)
class MaterializationPlan:
    """V (materialized keys, inputs excluded) and one reuse plan per unit; ``status``: how the solve ended (optimal,
    feasible: its deterministic budget ran out first, wall_stop: its wall-clock safety stop did)."""

    materialized: tuple[str, ...]
    reuse: tuple[ReusePlan, ...]
    objective: float  # equation 9: sum of unit cost x records x epochs
    storage_bytes: float  # of V at ``records``
    records: int
    status: str = OPTIMAL


@dataclass(frozen=True)
class _Unit:
    keys: tuple[str, ...]  # topological
    outputs: tuple[str, ...]
    epochs: int


def units_for(mm: MultiModelGraph, groups: Sequence[Sequence[int]], epochs: Sequence[int]) -> list[_Unit]:
    """One unit per group of models (a fused group shares its merged layers); epochs of a group: its maximum."""
    units = []
    for grp in groups:
        keys: dict[str, None] = {}
        for i in grp:
            for k in mm.model_keys(i):
                keys.setdefault(k)
        units.append(
            _Unit(tuple(keys), tuple(dict.fromkeys(mm.output_key(i) for i in grp)), max(epochs[i] for i in grp))
        )
    return units


def solve_reuse(
    mm: MultiModelGraph,
    units: Sequence[_Unit],
    cost_model: CostModel,
    *,
    records: int,
    disk_budget: float = math.inf,
    fixed: Iterable[str] | None = None,
    time_limit_s: float = 30.0,
) -> MaterializationPlan:
    """Solve equations 9-10 over ``units``. With ``fixed`` (a set V), Z is fixed and the budget dropped (4.3.2).
    ``time_limit_s``: the solve's budget in reference seconds of deterministic work (see the module docstring)."""
    _check_positive("records", records)
    _check_positive("time_limit_s", time_limit_s)
    check_disk_budget(disk_budget)
    backend, solver = "SCIP", pywraplp.Solver.CreateSolver("SCIP")
    if solver is None:
        backend, solver = "CP-SAT", pywraplp.Solver.CreateSolver("CP-SAT")
    assert solver is not None, "OR-Tools ships SCIP and CP-SAT"
    layers = mm.layers
    loadable = [k for k in mm.materializable if layers[k].per_record]
    fixed_set = set(fixed) if fixed is not None else None
    z = {}
    for k in loadable:
        if layers[k].op == "placeholder":
            z[k] = 1
        elif fixed_set is not None:
            z[k] = 1 if k in fixed_set else 0
        else:
            z[k] = solver.BoolVar(f"z[{k}]")
    objective = []
    xy = []
    for u_idx, u in enumerate(units):
        x = {k: solver.BoolVar(f"x[{u_idx},{k}]") for k in u.keys}
        y = {k: solver.BoolVar(f"y[{u_idx},{k}]") for k in u.keys}
        xy.append((x, y))
        for k in u.keys:
            node = layers[k]
            c_comp = compute_cost(node)
            c_load = cost_model.load_cost(node.out_bytes) if k in z else 0.0
            if k in u.outputs:
                solver.Add(x[k] >= 1)  # (a)
            solver.Add(x[k] - y[k] >= 0)  # (b)
            # (c), per parent: the paper's sum form would let a multi-input layer run with one input missing
            for p in mm.parents[k]:
                solver.Add(x[p] - y[k] >= 0)
            if node.op == "placeholder":
                solver.Add(y[k] == 0)  # records are read, never computed
            if k in z:
                if isinstance(z[k], int):
                    if z[k] == 0:
                        solver.Add(x[k] - y[k] <= 0)
                else:
                    solver.Add(x[k] - y[k] <= z[k])  # (d)
            else:
                solver.Add(x[k] - y[k] <= 0)  # not storable: computed if present
            scale = records * u.epochs
            objective.append((x[k] * c_load + y[k] * (c_comp - c_load)) * scale)
    free = [k for k in z if not isinstance(z[k], int)]
    if free and not math.isinf(disk_budget):
        solver.Add(sum(z[k] * layers[k].out_bytes * records for k in free) <= disk_budget)  # (e)
    # a tiny storage penalty keeps unused layers out of V
    solver.Minimize(sum(objective) + 1e-9 * sum(z[k] * layers[k].out_bytes for k in free))
    limit = bound_mip_by_work(solver, backend, time_limit_s)
    t0 = time.perf_counter()
    status = solver.Solve()
    stopped = mip_wall_stopped(status, time.perf_counter() - t0, time_limit_s)
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        why = "its wall-clock safety stop" if stopped else limit
        raise RuntimeError(f"materialization MILP has no solution (status {status}, stopped by {why})")
    reuse = []
    loaded: set[str] = set()
    for u, (x, y) in zip(units, xy, strict=True):
        actions, cost = {}, 0.0
        for k in u.keys:
            xv, yv = x[k].solution_value() > 0.5, y[k].solution_value() > 0.5
            act = COMPUTE if yv else (LOAD if xv else PRUNE)
            actions[k] = act
            if act == COMPUTE:
                cost += compute_cost(layers[k])
            elif act == LOAD:
                cost += cost_model.load_cost(layers[k].out_bytes)
                loaded.add(k)
        reuse.append(ReusePlan(actions, cost))
    # post-processing: V keeps only layers some unit loads (inputs are the records themselves)
    mat = tuple(k for k in loadable if k in loaded and layers[k].op != "placeholder")
    obj = sum(r.cost * records * u.epochs for r, u in zip(reuse, units, strict=True))
    how = WALL_STOP if stopped else (OPTIMAL if status == pywraplp.Solver.OPTIMAL else FEASIBLE)
    return MaterializationPlan(mat, tuple(reuse), obj, sum(layers[k].out_bytes for k in mat) * records, records, how)


def optimize_materialization(
    mm: MultiModelGraph,
    cost_model: CostModel,
    *,
    records: int,
    epochs: Sequence[int],
    disk_budget: float = math.inf,
    time_limit_s: float = 30.0,
) -> MaterializationPlan:
    """Nautilus equations 9-10: the materialized set V and each model's optimal reuse plan."""
    units = _model_units(mm, epochs)
    return solve_reuse(mm, units, cost_model, records=records, disk_budget=disk_budget, time_limit_s=time_limit_s)


def _model_units(mm: MultiModelGraph, epochs: Sequence[int]) -> list[_Unit]:
    """One unit per model (no fusion), each trained `epochs[i]` epochs; `epochs` checked."""
    if len(epochs) != len(mm.models):
        raise ValueError(f"`epochs` has {len(epochs)} entries, but there are {len(mm.models)} models")
    for e in epochs:
        if not isinstance(e, int) or e < 1:
            raise ValueError(f"`epochs` holds {e!r}, but every entry must be an int >= 1")
    return units_for(mm, [[i] for i in range(len(mm.models))], epochs)


def reuse_closure(
    mm: MultiModelGraph, keys: Sequence[str], outputs: Sequence[str], loaded: Iterable[str], cost_model: CostModel
) -> ReusePlan | None:
    """The reuse plan that loads the keys of ``loaded`` it needs and computes everything else it needs.

    Walking back from ``outputs``: a key in ``loaded`` is loaded, any other key is computed and its parents are needed
    in turn. None when that would compute an input (records are read, never computed).
    """
    loaded = set(loaded)
    actions = dict.fromkeys(keys, PRUNE)
    cost, stack = 0.0, list(outputs)
    while stack:
        k = stack.pop()
        if actions[k] != PRUNE:
            continue
        if k in loaded:
            actions[k] = LOAD
            cost += cost_model.load_cost(mm.layers[k].out_bytes)
        elif mm.layers[k].op == "placeholder":
            return None
        else:
            actions[k] = COMPUTE
            cost += compute_cost(mm.layers[k])
            stack.extend(mm.parents[k])
    return ReusePlan(actions, cost)


def _unit_best(mm: MultiModelGraph, u: _Unit, loadable: frozenset[str], cost_model: CostModel) -> ReusePlan:
    """Cheapest plan of one unit when the keys of ``loadable`` (stored layers and inputs) may be loaded.

    Every subset L of the unit's loadable keys is tried as "the layers it loads" (``reuse_closure``). Costs are
    non-negative, so a plan that makes more layers present than its closure never costs less.
    """
    cand = [k for k in u.keys if k in loadable]
    best = ReusePlan({}, math.inf)
    for n in range(len(cand) + 1):
        for chosen in itertools.combinations(cand, n):
            plan = reuse_closure(mm, u.keys, u.outputs, chosen, cost_model)
            if plan is not None and plan.cost < best.cost and all(plan.actions[k] == LOAD for k in chosen):
                best = plan
    return best


def exhaustive_materialization(
    mm: MultiModelGraph,
    cost_model: CostModel,
    *,
    records: int,
    epochs: Sequence[int],
    disk_budget: float = math.inf,
    max_storable: int = 12,
) -> MaterializationPlan:
    """The MILP's problem (equations 9-10, one unit per model) solved by enumeration, to check the MILP.

    Tries every set V of storable layers (materializable, per record, not an input) that fits ``disk_budget`` and,
    for each, every model's cheapest reuse plan (``_unit_best``); returns the cheapest. Exponential: refuses graphs
    with more than ``max_storable`` storable layers. Ties break towards the smaller V (the MILP's storage penalty).
    """
    _check_positive("records", records)
    check_disk_budget(disk_budget)
    units = _model_units(mm, epochs)
    layers = mm.layers
    inputs = frozenset(k for k in mm.materializable if layers[k].per_record and layers[k].op == "placeholder")
    storable = [k for k in mm.materializable if layers[k].per_record and layers[k].op != "placeholder"]
    if len(storable) > max_storable:
        raise ValueError(f"the graph has {len(storable)} storable layers, but `max_storable` is {max_storable}")
    unit_storable = [frozenset(k for k in storable if k in set(u.keys)) for u in units]
    cache: list[dict[frozenset[str], ReusePlan]] = [{} for _ in units]
    best: tuple[float, float, tuple[str, ...], list[ReusePlan]] | None = None
    for n in range(len(storable) + 1):
        for v in itertools.combinations(storable, n):
            nbytes = sum(layers[k].out_bytes for k in v) * records
            if nbytes > disk_budget:
                continue
            vset = frozenset(v)
            total, plans = 0.0, []
            for j, u in enumerate(units):
                key = vset & unit_storable[j]
                if key not in cache[j]:
                    cache[j][key] = _unit_best(mm, u, key | inputs, cost_model)
                total += cache[j][key].cost * records * u.epochs
                plans.append(cache[j][key])
            if best is None or total < best[0] * (1 - 1e-12) or (total <= best[0] and nbytes < best[1]):
                best = (total, nbytes, v, plans)
    assert best is not None, "the empty V always fits"
    total, _, v, plans = best
    used = {k for p in plans for k in p.keys(LOAD)}
    mat = tuple(k for k in storable if k in v and k in used)
    reuse = tuple(plans)
    return MaterializationPlan(mat, reuse, total, sum(layers[k].out_bytes for k in mat) * records, records)
