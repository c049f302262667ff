"""Transfer-learning model selection that shares frozen computation (Nautilus, with Vista and HAPI pieces).

Two layers:

``plan_transfer(models, example_input, ...) -> TransferPlan`` is the engine-facing API (no training loop). A plan
says which frozen layers to materialize (V), how to group configs (fusion) and, per group, which stored layers it
loads. A worker calls ``plan.materialize(store, ids, x)`` once per partition (near the data; one pass extracts every
layer in V, only for ids the store lacks). A config trains with ``plan.trainer(group)`` on features read by
``plan.load(store, group, ids, x)``; its hop carries ``plan.hop_state(i)`` (trainable parameters only).

``TransferSelection`` runs a whole labelling cycle in-process: ``fit(new_train, new_valid)`` appends the new records,
(re)plans, materializes the new records only, trains every config for its epochs and returns metrics. Methods:
``current_practice`` (no reuse, every config alone), ``mat_all`` (materialize every materializable layer, load it,
no fusion) and ``planner`` (MILP plan under the disk budget + fusion under the memory budget). All three are
logically equivalent: same initial weights, same batches, same frozen (eval-mode) prefix.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from framework.planner.execution import (
    KeyedModule,
    build_branch,
    build_bridge,
    build_extractor,
    state_bytes,
    trainable_state_dict,
)
from framework.planner.feature_store import FeatureStore
from framework.planner.fusion import FusedGroup, FusedTrainer, fuse_models
from framework.planner.memory import estimate_peak_memory
from framework.planner.milp import (
    CostModel,
    check_disk_budget,
    flops_optimal_speedup,
    measure_cost_model,
    optimize_materialization,
    reuse_closure,
    solve_reuse,
    units_for,
)
from framework.planner.multimodel import MultiModelGraph, build_multimodel
from framework.planner.profile import profile_model

METHODS = ("current_practice", "mat_all", "planner")
EXECUTIONS = ("eager", "staged")  # Vista's logical plans for extracting V (``TransferPlan.materialize``)


def _nearest(mm: MultiModelGraph, key: str, stored: set[str], input_key: str) -> list[str]:
    """The stored layers (or the raw input) ``key`` is computed from: walking back, the first stored key on every
    path; non-stored layers on the way are recomputed."""
    found: dict[str, None] = {}
    seen, stack = set(), list(mm.parents[key])
    while stack:
        k = stack.pop()
        if k in seen:
            continue
        seen.add(k)
        if k in stored or k == input_key:
            found[k] = None
        else:
            stack.extend(mm.parents[k])
    return list(found)


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"`method` is {method!r}, but must be one of {METHODS}")


@dataclass
class TransferPlan:
    """What to materialize, how configs are grouped, and the modules that run each group (see module docstring)."""

    mm: MultiModelGraph
    method: str
    materialized: tuple[str, ...]
    groups: list[FusedGroup]
    records: int  # r the plan was optimised for
    input_key: str = field(init=False)

    def __post_init__(self) -> None:
        self.input_key = next(k for k, n in self.mm.layers.items() if n.op == "placeholder")
        self._extractor = build_extractor(self.mm, self.materialized) if self.materialized else None
        self._bridges = [build_bridge(self.mm, g.loaded, g.members) for g in self.groups]
        self.last_extraction: dict[str, Any] = {}

    def group_of(self, i: int) -> int:
        """The index in ``groups`` of the fused group that holds config ``i``.

        Raises:
            ValueError: If no group holds ``i`` (it is not a config of the plan).
        """
        for g, grp in enumerate(self.groups):
            if i in grp.members:
                return g
        held = sorted(m for grp in self.groups for m in grp.members)
        raise ValueError(f"`i` is {i!r}, but no group of the plan holds it (the plan's configs: {held})")

    def materialize(
        self,
        store: FeatureStore,
        ids: Sequence[int],
        x: torch.Tensor,
        batch_size: int = 256,
        *,
        execution: str = "eager",
    ) -> int:
        """Extract every layer of V for the records of ``ids`` the store lacks; returns the records extracted.

        ``x`` holds the raw records of ``ids``, in that order. ``execution`` is Vista's logical plan (thesis 8.3.2):
        ``"eager"`` runs one pass that produces every layer of V per batch and holds all of them, for all records,
        until it writes them; ``"staged"`` produces one layer of V at a time (in topological order), each from the
        nearest layers already stored (read back from ``store``) or the raw records, and writes it before the next
        stage, so only one layer's features are held at a time, at the cost of reading earlier stages back (and of
        recomputing any non-stored layer two stages share). Both give the same features. ``last_extraction``
        then describes the run: seconds, the peak bytes of features and batch inputs held, bytes read back.
        """
        if execution not in EXECUTIONS:
            raise ValueError(f"`execution` is {execution!r}, but must be one of {EXECUTIONS}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"`batch_size` is {batch_size!r}, but must be an int >= 1")
        t0 = time.perf_counter()
        self.last_extraction = {"execution": execution, "seconds": 0.0, "peak_bytes": 0, "read_bytes": 0}
        if self._extractor is None:
            return 0
        ids = np.asarray(ids, dtype=np.int64)
        need = np.zeros(len(ids), dtype=bool)
        for k in self.materialized:
            need |= np.isin(ids, store.missing(k, ids))
        rows = np.nonzero(need)[0]
        if not len(rows):
            return 0
        if execution == "staged":
            self._materialize_staged(store, ids, x, batch_size)
        else:
            self._materialize_eager(store, ids, rows, x, batch_size)
        self.last_extraction["seconds"] = time.perf_counter() - t0
        return len(rows)

    def _materialize_eager(
        self, store: FeatureStore, ids: np.ndarray, rows: np.ndarray, x: torch.Tensor, batch_size: int
    ) -> None:
        self._extractor.eval()
        outs: list[list[np.ndarray]] = [[] for _ in self.materialized]
        held = 0
        with torch.no_grad():
            for s in range(0, len(rows), batch_size):
                xb = x[torch.as_tensor(rows[s : s + batch_size])]
                feats = self._extractor(xb)
                for j, f in enumerate(feats):
                    outs[j].append(f.numpy())
                    held += f.numel() * f.element_size()
                self._peak(held + xb.numel() * xb.element_size())
        for j, k in enumerate(self.materialized):
            vals = np.concatenate(outs[j])
            miss = np.isin(ids[rows], store.missing(k, ids[rows]))
            store.append(k, ids[rows][miss], vals[miss])

    def _materialize_staged(self, store: FeatureStore, ids: np.ndarray, x: torch.Tensor, batch_size: int) -> None:
        stored: list[str] = []
        for k in self.materialized:  # topological: a stage's stored inputs were filled by earlier stages
            inputs = _nearest(self.mm, k, set(stored), self.input_key)
            stored.append(k)
            missing = store.missing(k, ids)
            if not len(missing):
                continue
            rows = np.nonzero(np.isin(ids, missing))[0]
            stage = KeyedModule(self.mm, inputs, [k]).eval()
            outs, held = [], 0
            with torch.no_grad():
                for s in range(0, len(rows), batch_size):
                    r = rows[s : s + batch_size]
                    xs = [x[torch.as_tensor(r)] if i == self.input_key else torch.from_numpy(store.read(i, ids[r]))
                          for i in inputs]
                    read = sum(t.numel() * t.element_size() for i, t in zip(inputs, xs, strict=True)
                               if i != self.input_key)
                    self.last_extraction["read_bytes"] += read
                    (f,) = stage(*xs)
                    outs.append(f.numpy())
                    held += f.numel() * f.element_size()
                    self._peak(held + sum(t.numel() * t.element_size() for t in xs))
            store.append(k, ids[rows], np.concatenate(outs))

    def _peak(self, nbytes: int) -> None:
        self.last_extraction["peak_bytes"] = max(self.last_extraction["peak_bytes"], int(nbytes))

    def loaded_keys(self, g: int) -> list[str]:
        """The stored layers (or the raw input) group ``g`` reads, in the order its bridge takes them."""
        return list(self._bridges[g].input_keys)

    def load(self, store: FeatureStore, g: int, ids: Sequence[int], x: torch.Tensor | None) -> list[torch.Tensor]:
        """The tensors group ``g`` reads for ``ids`` (raw records come from ``x``, indexed by position in ids)."""
        out = []
        for k in self.loaded_keys(g):
            if k == self.input_key:
                assert x is not None, "this group reads raw records"
                out.append(x)
            else:
                out.append(torch.from_numpy(store.read(k, ids)))
        return out

    def bridge(self, g: int) -> KeyedModule:
        """Group ``g``'s shared frozen module: the layers it loads -> the boundaries of its members, each shared layer
        computed once (run in eval mode)."""
        return self._bridges[g]

    def branch(self, i: int) -> KeyedModule:
        """Config ``i``'s trainable remainder; its parameters are the model's own."""
        return build_branch(self.mm, i)

    def trainer(
        self,
        g: int,
        optimizer_fn: Callable[[list[nn.Parameter], int], torch.optim.Optimizer],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        seeds: Sequence[int],
    ) -> FusedTrainer:
        """A ``FusedTrainer`` for group ``g``: its bridge and one branch and optimizer per member config.

        Args:
            g: the group's index in ``groups``.
            optimizer_fn: ``(trainable parameters, config index) -> optimizer``, called once per member.
            loss_fn: ``(outputs, labels) -> loss``, shared by every member.
            seeds: one per member, in the order of ``groups[g].members``; each member draws its randomness from
                its own generator (dropout and the like), so fused training matches training alone.

        Raises:
            ValueError: If ``seeds`` does not hold one seed per member.
        """
        members = self.groups[g].members
        branches = [self.branch(i) for i in members]
        opts = [
            optimizer_fn([p for p in b.parameters() if p.requires_grad], i)
            for b, i in zip(branches, members, strict=False)
        ]
        return FusedTrainer(self.bridge(g), branches, opts, loss_fn, seeds)

    def hop_state(self, i: int) -> dict[str, torch.Tensor]:
        """Config ``i``'s trainable state (parameters that require grad, plus the buffers of trainable modules): what a
        hop of that config carries under the plan."""
        return trainable_state_dict(self.branch(i))

    def hop_bytes(self, i: int) -> tuple[int, int]:
        """(whole model state, trainable state only): what a hop carries without and with the plan."""
        return state_bytes(self.mm.models[i].gm.state_dict()), state_bytes(self.hop_state(i))


def plan_transfer(
    models: Sequence[nn.Module],
    example_input: torch.Tensor,
    *,
    method: str = "planner",
    batch_sizes: Sequence[int],
    epochs: Sequence[int],
    records: int,
    disk_budget: float = math.inf,
    memory_budget: float = math.inf,
    cost_model: CostModel | None = None,
    workspace_bytes: int = 0,
    mm: MultiModelGraph | None = None,
) -> TransferPlan:
    """Profile ``models``, merge them and plan with ``method`` (see module docstring); ``mm`` reuses a profile."""
    _check_method(method)
    cost_model = cost_model or measure_cost_model()
    if mm is None:
        mm = build_multimodel([profile_model(m, example_input) for m in models])
    n = len(models)
    if method == "current_practice":
        units = units_for(mm, [[i] for i in range(n)], epochs)
        plan = solve_reuse(mm, units, cost_model, records=records, fixed=())
        groups = [FusedGroup((i,), p, estimate_peak_memory(mm, p, batch_sizes[i])) for i, p in enumerate(plan.reuse)]
        return TransferPlan(mm, method, (), groups, records)
    if method == "mat_all":
        everything = [k for k in mm.materializable if mm.layers[k].per_record and mm.layers[k].op != "placeholder"]
        # load whatever is stored, efficient or not (Nautilus' MAT-ALL), and only what the model needs: walking back
        # from its output, the first stored layer on every path is loaded (an optimiser with free loads could pick
        # any superset of that, at a real I/O cost)
        inputs = [k for k in mm.layers if mm.layers[k].op == "placeholder"]
        reuse = [
            reuse_closure(mm, u.keys, u.outputs, [*everything, *inputs], cost_model)
            for u in units_for(mm, [[i] for i in range(n)], epochs)
        ]
        groups = [FusedGroup((i,), p, estimate_peak_memory(mm, p, batch_sizes[i])) for i, p in enumerate(reuse)]
        return TransferPlan(mm, method, tuple(everything), groups, records)
    plan = optimize_materialization(mm, cost_model, records=records, epochs=epochs, disk_budget=disk_budget)
    groups = fuse_models(
        mm,
        plan.materialized,
        cost_model,
        batch_sizes=batch_sizes,
        epochs=epochs,
        memory_budget=memory_budget,
        workspace_bytes=workspace_bytes,
    )
    return TransferPlan(mm, method, plan.materialized, groups, records)


@dataclass
class TransferResult:
    """One labelling cycle: metrics (one row per config x epoch), the best config, timings in seconds."""

    metrics: pd.DataFrame
    best_config_id: int
    best_config: Mapping[str, Any]
    timings: dict[str, float]
    plan: TransferPlan


def _default_optimizer(params: list[nn.Parameter], config: Mapping[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=float(config.get("lr", 1e-3)))


class TransferSelection:
    """Nautilus-style model selection over labelling cycles; call ``fit`` once per cycle.

    Args:
        model_fn: ``config -> nn.Module`` with the frozen part's ``requires_grad`` already False. Called under
            ``torch.manual_seed(seed * 100_003 + config_id)`` so every method starts from the same weights.
        configs: user configs (dicts) with ``batch_size`` and optionally ``lr`` and ``epochs``.
        method: one of ``METHODS``.
        disk_budget, memory_budget: B_disk (>= 0; 0 stores nothing) and B_mem (> 0) in bytes. ``initial_records``:
            the first r (doubles when the labelled records, training and validation, outgrow it, and the plan is
            re-optimised). The store is append-only: a layer that leaves V on such a re-plan keeps its features, so
            after r doubles the store can exceed ``disk_budget`` (set ``initial_records`` to the expected total). ``store_dir``: the
            feature store root, or a ``FeatureStore`` (a subclass may, say, model slower storage). ``extraction``:
            Vista's ``"eager"`` or ``"staged"`` plan for materializing (``TransferPlan.materialize``).
    """

    def __init__(
        self,
        model_fn: Callable[[Mapping[str, Any]], nn.Module],
        configs: Sequence[Mapping[str, Any]],
        *,
        store_dir: str | Path | FeatureStore,
        method: str = "planner",
        epochs: int = 5,
        disk_budget: float = math.inf,
        memory_budget: float = math.inf,
        initial_records: int = 1000,
        cost_model: CostModel | None = None,
        seed: int = 0,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        optimizer_fn: Callable[[list[nn.Parameter], Mapping[str, Any]], torch.optim.Optimizer] | None = None,
        eval_batch_size: int = 256,
        extraction: str = "eager",
    ) -> None:
        _check_method(method)
        if extraction not in EXECUTIONS:
            raise ValueError(f"`extraction` is {extraction!r}, but must be one of {EXECUTIONS}")
        if not configs:
            raise ValueError("`configs` is empty, but must hold at least one config")
        for cid, c in enumerate(configs):
            bs = c.get("batch_size")
            if not isinstance(bs, int) or bs < 1:
                raise ValueError(f"`configs[{cid}]['batch_size']` is {bs!r}, but must be an int >= 1")
            e = c.get("epochs", epochs)
            if not isinstance(e, int) or e < 1:
                raise ValueError(f"`configs[{cid}]['epochs']` is {e!r}, but must be an int >= 1")
        if not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"`epochs` is {epochs!r}, but must be an int >= 1")
        check_disk_budget(disk_budget)
        if not isinstance(memory_budget, (int, float)) or math.isnan(memory_budget) or memory_budget <= 0:
            raise ValueError(f"`memory_budget` is {memory_budget!r}, but must be a positive number of bytes")
        if not isinstance(initial_records, int) or initial_records < 1:
            raise ValueError(f"`initial_records` is {initial_records!r}, but must be an int >= 1")
        if not isinstance(eval_batch_size, int) or eval_batch_size < 1:
            raise ValueError(f"`eval_batch_size` is {eval_batch_size!r}, but must be an int >= 1")
        self.model_fn, self.configs, self.method = model_fn, [dict(c) for c in configs], method
        self.epochs = [int(c.get("epochs", epochs)) for c in self.configs]
        self.batch_sizes = [int(c["batch_size"]) for c in self.configs]
        self.disk_budget, self.memory_budget = float(disk_budget), float(memory_budget)
        self.records = initial_records
        self.cost_model, self.seed = cost_model, seed
        self.loss_fn = loss_fn or nn.functional.cross_entropy
        self.optimizer_fn = optimizer_fn or _default_optimizer
        self.eval_batch_size = eval_batch_size
        self.extraction = extraction
        self.store = store_dir if isinstance(store_dir, FeatureStore) else FeatureStore(store_dir)
        self.cycle = 0
        self.extracted_records = 0  # records run through the extractor, all cycles
        self.replans = 0
        self._models: list[nn.Module] | None = None
        self._init: list[dict[str, torch.Tensor]] = []
        self._mm: MultiModelGraph | None = None
        self._plan: TransferPlan | None = None
        self._x: list[torch.Tensor] = []
        self._y: list[torch.Tensor] = []
        self._train_ids: list[np.ndarray] = []
        self._valid_ids: list[np.ndarray] = []
        self._next_id = 0

    def _add(self, data: tuple[torch.Tensor, torch.Tensor], name: str) -> np.ndarray:
        if not (isinstance(data, (tuple, list)) and len(data) == 2 and len(data[0]) == len(data[1])):
            raise ValueError(f"`{name}` must be a pair (inputs, labels) of equal length")
        ids = np.arange(self._next_id, self._next_id + len(data[0]), dtype=np.int64)
        self._next_id += len(ids)
        self._x.append(data[0])
        self._y.append(data[1])
        return ids

    def fit(
        self, new_train: tuple[torch.Tensor, torch.Tensor], new_valid: tuple[torch.Tensor, torch.Tensor]
    ) -> TransferResult:
        """Run one labelling cycle: add the new records, re-plan if needed, materialize, train every config, rank.

        The records of all cycles so far are kept; each cycle restarts every config from the same initial weights
        and trains it for its epochs on all the labelled training records. The first cycle plans; a later one
        re-plans only when the labelled records (training and validation) outgrow r, which then doubles until they
        fit. Only records whose features the store lacks are extracted.

        Args:
            new_train: ``(inputs, labels)`` of the records labelled for training in this cycle.
            new_valid: ``(inputs, labels)`` of the records labelled for validation in this cycle.

        Returns:
            The cycle's ``TransferResult``: one metrics row per config x epoch, the config with the highest last
            ``valid_acc`` (ties: lowest ``valid_loss``), timings in seconds and the plan used.

        Raises:
            ValueError: If ``new_train`` or ``new_valid`` is not a pair (inputs, labels) of equal length.
        """
        t_start = time.perf_counter()
        self._train_ids.append(self._add(new_train, "new_train"))
        self._valid_ids.append(self._add(new_valid, "new_valid"))
        x, y = torch.cat(self._x), torch.cat(self._y)
        train_ids, valid_ids = np.concatenate(self._train_ids), np.concatenate(self._valid_ids)
        if self.cost_model is None:
            self.cost_model = measure_cost_model()

        t0 = time.perf_counter()
        if self._models is None:  # built and profiled once; every cycle restarts from the same initial weights
            self._models = []
            for cid, c in enumerate(self.configs):
                torch.manual_seed(self.seed * 100_003 + cid)
                self._models.append(self.model_fn(c))
            self._init = [{k: v.clone() for k, v in m.state_dict().items()} for m in self._models]
            self._mm = build_multimodel([profile_model(m, x[:1]) for m in self._models])
        else:
            for m, init in zip(self._models, self._init, strict=True):
                m.load_state_dict(init)
        # Nautilus 4.2.3: r doubles, then re-plan. r counts every record whose features are stored (training and
        # validation), so the disk budget holds for the store as it is, not only for the training records.
        while len(train_ids) + len(valid_ids) > self.records:
            self.records *= 2
        if self._plan is None or self._plan.records != self.records:
            # with r and the cost model fixed the MILP's V is fixed too, so the plan is kept until r is reached
            self.replans += 1
            self._plan = plan_transfer(
                self._models,
                x[:1],
                method=self.method,
                batch_sizes=self.batch_sizes,
                epochs=self.epochs,
                records=self.records,
                disk_budget=self.disk_budget,
                memory_budget=self.memory_budget,
                cost_model=self.cost_model,
                mm=self._mm,
            )
        plan = self._plan
        t_plan = time.perf_counter() - t0

        t0 = time.perf_counter()
        all_ids = np.concatenate([train_ids, valid_ids])
        self.extracted_records += plan.materialize(
            self.store, all_ids, x[torch.as_tensor(all_ids)], execution=self.extraction
        )
        t_mat = time.perf_counter() - t0

        t0 = time.perf_counter()
        rows = []
        for g, grp in enumerate(plan.groups):
            rows += self._train_group(plan, g, grp, x, y, train_ids, valid_ids)
        t_train = time.perf_counter() - t0

        metrics = pd.DataFrame(rows).sort_values(["config_id", "epoch"], ignore_index=True)
        metrics.insert(0, "cycle", self.cycle)
        last = metrics.sort_values("epoch").groupby("config_id").tail(1)
        best = int(last.sort_values(["valid_acc", "valid_loss"], ascending=[False, True]).iloc[0]["config_id"])
        self.cycle += 1
        timings = {
            "plan_s": t_plan,
            "materialize_s": t_mat,
            "train_s": t_train,
            "total_s": time.perf_counter() - t_start,
            "flops_optimal_speedup": flops_optimal_speedup(plan.mm, self.epochs),
        }
        return TransferResult(metrics, best, self.configs[best], timings, plan)

    def _train_group(
        self,
        plan: TransferPlan,
        g: int,
        grp: FusedGroup,
        x: torch.Tensor,
        y: torch.Tensor,
        train_ids: np.ndarray,
        valid_ids: np.ndarray,
    ) -> list[dict[str, Any]]:
        members = grp.members
        seeds = [self.seed * 100_003 + i + 7919 * self.cycle for i in members]
        trainer = plan.trainer(g, lambda ps, i: self.optimizer_fn(ps, self.configs[i]), self.loss_fn, seeds)
        bs, epochs = self.batch_sizes[members[0]], max(self.epochs[i] for i in members)
        reads_raw = plan.input_key in plan.loaded_keys(g)
        rows = []
        for epoch in range(epochs):
            active = [epoch < self.epochs[i] for i in members]
            order = torch.randperm(
                len(train_ids), generator=torch.Generator().manual_seed(self.seed + 1009 * self.cycle + epoch)
            )
            losses = np.zeros(len(members))
            nb = 0
            for s in range(0, len(order), bs):
                ids = train_ids[order[s : s + bs].numpy()]
                t_ids = torch.as_tensor(ids)
                feats = plan.load(self.store, g, ids, x[t_ids] if reads_raw else None)
                losses += np.nan_to_num(trainer.step(feats, y[t_ids], active))
                nb += 1
            v_loss, v_correct = np.zeros(len(members)), np.zeros(len(members))
            for s in range(0, len(valid_ids), self.eval_batch_size):
                ids = valid_ids[s : s + self.eval_batch_size]
                t_ids = torch.as_tensor(ids)
                outs = trainer.predict(plan.load(self.store, g, ids, x[t_ids] if reads_raw else None))
                for j, out in enumerate(outs):
                    v_loss[j] += float(self.loss_fn(out, y[t_ids], reduction="sum"))
                    v_correct[j] += float((out.argmax(-1) == y[t_ids]).sum())
            for j, i in enumerate(members):
                if active[j]:
                    rows.append(
                        {
                            "config_id": i,
                            "epoch": epoch,
                            "group": g,
                            "train_loss": losses[j] / max(nb, 1),
                            "valid_loss": v_loss[j] / len(valid_ids),
                            "valid_acc": v_correct[j] / len(valid_ids),
                        }
                    )
        return rows
