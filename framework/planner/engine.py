"""Run a transfer plan on the MOP engine: frozen-prefix features near the data, hops with trainable state only.

``transfer_on_engine(model_fn, configs, example_input, ...) -> EngineTransfer`` builds every config's model once (on
the driver, seeded as the engine seeds a config), plans with ``plan_transfer`` and returns the two pieces
``ModelSelection`` takes:

- ``extract``: raw records -> every stored layer the configs read, in one pass (Vista's Eager plan, in batches
  sized to ``worker_memory_budget`` by HAPI equation 1). A worker applies it once to each partition it loads
  (``ModelSelection(extract=...)``), so the partition holds features, not records; every config's units on that
  worker read them. Which layers: the plan's (default), or HAPI's split point (``split="hapi"``).
- ``model_fn``: ``config -> (module, optimizer)``: config ``i``'s remainder over those features (the frozen layers
  between the stored ones and its boundary, run in eval mode, then its trainable layers) and an optimizer over its
  trainable parameters. Its initial weights come from the plan (pickled once), so they are the same on every worker.
  Its ``state_dict`` holds only the trainable state, so a hop carries only that (``plan.hop_bytes(i)``: before/after).

Features are a tensor when the configs read one layer, else a dict ``{"f0": ..., "f1": ...}``; ``take`` and
``feature_len`` let a ``train_fn`` batch either (``framework.examples.feature_classifier_train_fn``).
Pure torch: no Ray here.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from framework.engine.runner import seed_everything
from framework.planner.execution import (
    KeyedModule,
    ancestors_or_self,
    boundary_keys,
    build_bridge,
    trainable_state_dict,
)
from framework.planner.memory import estimate_peak_memory
from framework.planner.milp import COMPUTE, LOAD, PRUNE, CostModel, ReusePlan
from framework.planner.multimodel import MultiModelGraph
from framework.planner.split import choose_split_index, extraction_batch_size
from framework.planner.transfer import TransferPlan, plan_transfer
from framework.scheduling.units import unit_seed

Features = torch.Tensor | dict[str, torch.Tensor]
SPLITS = ("plan", "hapi", "freeze", "input")
EXTRACT_MAX_BATCH = 4096  # the largest extraction batch ``worker_memory_budget`` may give


def take(features: Any, idx: Any) -> Any:
    """Rows ``idx`` of a features tensor (or array) or of every tensor of a features dict."""
    if isinstance(features, Mapping):
        return {k: v[idx] for k, v in features.items()}
    return features[idx]


def feature_len(features: Any) -> int:
    """Records in a features tensor or features dict."""
    if isinstance(features, Mapping):
        if not features:
            raise ValueError("`features` is an empty dict, but must hold at least one tensor")
        return len(next(iter(features.values())))
    return len(features)


def config_key(config: Mapping[str, Any]) -> str:
    """The stable key that matches an engine config to its plan index."""
    return json.dumps(dict(config), sort_keys=True, default=str)


class FeatureExtractor(nn.Module):
    """Raw records -> the stored layers (a tensor for one layer, else a dict of named tensors); always eval mode."""

    def __init__(
        self, net: KeyedModule | None, names: Sequence[str], raw: str | None, batch_size: int | None = None
    ) -> None:
        super().__init__()
        self.net, self.names, self.raw = net, tuple(names), raw  # raw: the name the raw input goes under, if read
        self.batch_size = batch_size  # rows per forward pass (HAPI's extraction batch), None: all at once

    def forward(self, x: torch.Tensor) -> Features:
        outs: dict[str, torch.Tensor] = {}
        if self.net is not None:
            step = self.batch_size or max(len(x), 1)
            parts = [self.net(x[s : s + step]) for s in range(0, len(x), step)] or [self.net(x)]
            outs = {n: torch.cat([p[j] for p in parts]) for j, n in enumerate(self.names)}
        if self.raw is not None:
            outs[self.raw] = x
        if len(outs) == 1:
            return next(iter(outs.values()))
        return outs

    def train(self, mode: bool = True) -> FeatureExtractor:
        super().train(False)
        if self.net is not None:
            self.net.train(False)
        return self


class FeatureBranch(nn.Module):
    """Config ``i`` over extracted features; ``state_dict`` (what a hop carries) holds only its trainable state.

    The frozen weights it holds are the plan's, identical on every worker, so ``load_state_dict`` fills them in.
    """

    def __init__(self, net: KeyedModule, names: Sequence[str]) -> None:
        super().__init__()
        self.net, self.names = net, tuple(names)
        self._hop_keys = frozenset("net." + k for k in trainable_state_dict(net))

    def forward(self, features: Features) -> torch.Tensor:
        if isinstance(features, Mapping):
            return self.net(*(features[n] for n in self.names))[0]
        if len(self.names) != 1:
            raise TypeError(f"this branch reads the features {list(self.names)}, but got a single tensor")
        return self.net(features)[0]

    def train(self, mode: bool = True) -> FeatureBranch:
        self.training = mode
        self.net.train(mode)  # frozen layers stay in eval mode
        return self

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        full = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        return type(full)((k, v) for k, v in full.items() if k[len(prefix) :] in self._hop_keys)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        if strict:
            unknown = set(state_dict) - self._hop_keys
            if unknown:
                raise RuntimeError(f"unexpected keys in a FeatureBranch state: {sorted(unknown)}")
        full = {**super().state_dict(), **state_dict}
        return super().load_state_dict(full, strict=strict, assign=assign)


class BranchModelFn:
    """The engine's ``model_fn``: ``config -> (a fresh copy of its branch, an optimizer over its trainable params)``.

    Holds only the branches (not the plan), so it pickles small and every worker builds the same initial weights.
    """

    def __init__(
        self,
        configs: Sequence[Mapping[str, Any]],
        branches: Sequence[FeatureBranch],
        optimizers: Sequence[Callable[[list[nn.Parameter]], torch.optim.Optimizer]],
    ) -> None:
        self.branches, self.optimizers = list(branches), list(optimizers)
        self.keys = {config_key(c): i for i, c in enumerate(configs)}

    def index(self, config: Mapping[str, Any]) -> int:
        """The plan index of an engine config (by ``config_key``)."""
        key = config_key(config)
        if key not in self.keys:
            raise KeyError(f"config {key} is not among the configs the plan was built for")
        return self.keys[key]

    def __call__(self, config: Mapping[str, Any]) -> tuple[nn.Module, torch.optim.Optimizer]:
        i = self.index(config)
        branch = copy.deepcopy(self.branches[i])
        return branch, self.optimizers[i]([p for p in branch.parameters() if p.requires_grad])


@dataclass
class EngineTransfer:
    """A transfer plan packaged for ``ModelSelection``: pass ``extract=`` and ``model_fn=`` (see module docstring).

    Only ``extract`` and ``model_fn`` travel to the workers; the plan stays on the driver.
    """

    plan: TransferPlan
    configs: list[dict[str, Any]]
    extract: FeatureExtractor | None  # None: nothing is stored, configs read raw records
    model_fn: BranchModelFn
    split: str = "plan"  # how the stored layers were chosen (see ``transfer_on_engine``)
    split_keys: tuple[str, ...] = ()  # the layers extracted near the data (multi-model keys)

    def index(self, config: Mapping[str, Any]) -> int:
        """The plan index of an engine config (its position in ``configs``, matched by ``config_key``).

        Raises:
            KeyError: If ``config`` is not one of the configs the plan was built for.
        """
        return self.model_fn.index(config)

    @property
    def branches(self) -> list[FeatureBranch]:
        """Each config's ``FeatureBranch``, in plan order (the initial models ``model_fn`` copies)."""
        return self.model_fn.branches

    def hop_bytes(self, config: Mapping[str, Any] | int) -> tuple[int, int]:
        """(whole model state, trainable state): bytes a hop of this config moves without and with the plan."""
        i = config if isinstance(config, int) else self.index(config)
        return self.plan.hop_bytes(i)

    def feature_bytes_per_record(self) -> int:
        """Bytes one record's stored features take on a worker (0 without ``extract``)."""
        if self.extract is None or self.extract.net is None:
            return 0
        return sum(int(self.plan.mm.layers[k].out_bytes) for k in self.extract.net.output_keys)


def _split(built: Any) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module):
        return built[0], built[1]
    if isinstance(built, nn.Module):
        return built, None
    raise TypeError(f"`model_fn` must return a torch.nn.Module or (module, optimizer), got {type(built).__name__}")


def _optimizer_factory(
    config: dict[str, Any],
    user_opt: torch.optim.Optimizer | None,
    optimizer_fn: Callable[[list[nn.Parameter], Mapping[str, Any]], torch.optim.Optimizer] | None,
) -> Callable[[list[nn.Parameter]], torch.optim.Optimizer]:
    if optimizer_fn is not None:
        return _UserOptimizer(optimizer_fn, config)
    if user_opt is not None:  # the same optimizer class and hyperparameters, over the trainable parameters only
        return _SameOptimizer(type(user_opt), dict(user_opt.defaults))
    return _SameOptimizer(torch.optim.Adam, {"lr": float(config.get("lr", 1e-3))})


@dataclass
class _UserOptimizer:
    fn: Callable[[list[nn.Parameter], Mapping[str, Any]], torch.optim.Optimizer]
    config: dict[str, Any]

    def __call__(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return self.fn(params, self.config)


@dataclass
class _SameOptimizer:
    cls: type[torch.optim.Optimizer]
    defaults: dict[str, Any]

    def __call__(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return self.cls(params, **self.defaults)


def transfer_on_engine(
    model_fn: Callable[[Mapping[str, Any]], Any],
    configs: Sequence[Mapping[str, Any]],
    example_input: torch.Tensor,
    *,
    method: str = "planner",
    batch_sizes: Sequence[int] | None = None,
    epochs: Sequence[int] | int = 1,
    records: int = 1000,
    optimizer_fn: Callable[[list[nn.Parameter], Mapping[str, Any]], torch.optim.Optimizer] | None = None,
    seed: int = 0,
    disk_budget: float = math.inf,
    memory_budget: float = math.inf,
    cost_model: CostModel | None = None,
    split: str = "plan",
    link_bytes_per_s: float = 1.25e8,
    worker_memory_budget: float = math.inf,
) -> EngineTransfer:
    """Plan ``configs`` for the MOP engine; pass the result's ``extract`` and ``model_fn`` to ``ModelSelection``.

    Args:
        model_fn: ``config -> nn.Module`` or ``(nn.Module, optimizer)`` (an engine ``model_fn`` works as is) with the
            frozen part's ``requires_grad`` already False. Config ``i`` is built under the seed the engine gives
            config id ``i`` in a run with seed ``seed``, so pass configs in the order the procedure adds them
            (``GridSearch(...).configs()``) for the same initial weights as a run without the plan.
        configs: the configs the run will train; matched to the engine's by ``config_key``.
        example_input: one or a few raw records (batch first), to trace and profile the models.
        method: ``"planner"`` (MILP plan), ``"mat_all"`` (store every frozen layer) or ``"current_practice"``
            (store nothing: ``extract`` is None and the configs read raw records).
        batch_sizes: per config (default: each config's ``batch_size``, else 32). ``epochs``: per config or one int.
        records: r, the records per worker the plan is optimised for.
        optimizer_fn: ``(trainable params, config) -> optimizer``; default: the class and hyperparameters of the
            optimizer ``model_fn`` returned, else Adam with the config's ``lr``.
        seed: the run seed of the ``ModelSelection`` the plan is for.
        disk_budget, memory_budget, cost_model: as in ``plan_transfer``.
        split: which layers a worker extracts near its data. ``"plan"``: the stored layers the plan's configs read.
            ``"hapi"``: HAPI Algorithm 1 (``choose_split_index``) over the frozen layers every config passes
            through, in order: the earliest whose per-record output is smaller than a record and whose output for
            one training batch (the smallest batch size) crosses ``link_bytes_per_s`` within 1 s, else the last of
            them (the freeze index); every config then computes its remaining frozen layers from it. ``"freeze"``:
            a fixed layer, that freeze index. ``"input"``: no near-data work (``extract`` is None; raw records).
        link_bytes_per_s: bandwidth between the data and the trainer, for ``"hapi"`` (default 1 Gbit/s).
        worker_memory_budget: bytes a worker may spend on extraction (model + one batch's live tensors, by the
            live-tensor memory estimate); the extraction batch is the largest that fits (HAPI equation 1,
            ``choose_extraction_batch_sizes``), at most 4096. Default: unlimited (the whole chunk at once).
    """
    configs = [dict(c) for c in configs]
    if not configs:
        raise ValueError("`configs` is empty, but must hold at least one config")
    keys = [config_key(c) for c in configs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"`configs` holds {dup} twice, but configs must be distinct (they are matched by value)")
    if not callable(model_fn):
        raise TypeError(f"`model_fn` is {model_fn!r}, but must be callable")
    if optimizer_fn is not None and not callable(optimizer_fn):
        raise TypeError(f"`optimizer_fn` is {optimizer_fn!r}, but must be callable or None")
    if not isinstance(example_input, torch.Tensor):
        raise TypeError(f"`example_input` is a {type(example_input).__name__}, but must be a torch.Tensor (batch first)")
    if not isinstance(seed, int):
        raise TypeError(f"`seed` is {seed!r}, but must be an int")
    if split not in SPLITS:
        raise ValueError(f"`split` is {split!r}, but must be one of {SPLITS}")
    for name, v in (("link_bytes_per_s", link_bytes_per_s), ("worker_memory_budget", worker_memory_budget)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v <= 0:
            unit = "bytes/s" if name == "link_bytes_per_s" else "bytes"
            raise ValueError(f"`{name}` is {v!r}, but must be a positive number ({unit})")
    n = len(configs)
    if batch_sizes is None:
        batch_sizes = [int(c.get("batch_size", 32)) for c in configs]
    if isinstance(epochs, int):
        epochs = [epochs] * n
    for name, vals in (("batch_sizes", batch_sizes), ("epochs", epochs)):
        if len(vals) != n or not all(isinstance(v, int) and v >= 1 for v in vals):
            raise ValueError(f"`{name}` is {list(vals)!r}, but must hold one int >= 1 per config ({n})")

    models, user_opts = [], []
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            for i, c in enumerate(configs):
                seed_everything(unit_seed(seed, i))  # what the engine does before model_fn(config) for config id i
                model, opt = _split(model_fn(c))
                models.append(model.to("cpu"))
                user_opts.append(opt)
    finally:  # the caller's random streams are left as they were
        random.setstate(py_state)
        np.random.set_state(np_state)
    plan = plan_transfer(
        models,
        example_input,
        method=method,
        batch_sizes=list(batch_sizes),
        epochs=list(epochs),
        records=records,
        disk_budget=disk_budget,
        memory_budget=memory_budget,
        cost_model=cost_model,
    )
    mm = plan.mm
    # the stored layers (or the raw input) each config reads, and one name per read key across configs
    if split == "plan":
        reads = [list(build_bridge(mm, plan.groups[plan.group_of(i)].loaded, [i]).input_keys) for i in range(n)]
    elif split == "input":
        reads = [[plan.input_key] for _ in range(n)]
    else:
        chain = common_frozen_chain(mm)
        if not chain:
            reads = [[plan.input_key] for _ in range(n)]
        else:
            idx = len(chain) - 1
            if split == "hapi":
                idx = choose_split_index(
                    [mm.layers[k].out_bytes for k in chain],
                    mm.layers[plan.input_key].out_bytes,
                    idx,
                    batch_size=min(batch_sizes),
                    bandwidth_bytes_per_s=link_bytes_per_s,
                )
            reads = [[chain[idx]] for _ in range(n)]
    stored = list(dict.fromkeys(k for r in reads for k in r if k != plan.input_key))
    names = {k: f"f{j}" for j, k in enumerate(stored)}
    raw = any(plan.input_key in r for r in reads)
    if raw:
        names[plan.input_key] = "input"
    extract = None
    if stored:
        extractor = KeyedModule(mm, [plan.input_key], stored)
        batch = None
        if not math.isinf(worker_memory_budget):
            per_record, model_bytes = extraction_memory(mm, plan.input_key, stored)
            if per_record + model_bytes > worker_memory_budget:
                raise ValueError(
                    f"`worker_memory_budget` is {worker_memory_budget!r}, but must hold the extractor "
                    f"({model_bytes} bytes) and one record's live tensors ({per_record} bytes)"
                )
            batch = extraction_batch_size(per_record, model_bytes, worker_memory_budget, EXTRACT_MAX_BATCH)
        extract = FeatureExtractor(extractor, [names[k] for k in stored], "input" if raw else None, batch).eval()
    branches = [
        FeatureBranch(KeyedModule(mm, r, [mm.output_key(i)]), [names[k] for k in r]) for i, r in enumerate(reads)
    ]
    optimizers = [_optimizer_factory(c, o, optimizer_fn) for c, o in zip(configs, user_opts, strict=True)]
    model_fns = BranchModelFn(configs, branches, optimizers)
    return EngineTransfer(plan, configs, extract, model_fns, split, tuple(stored))


def common_frozen_chain(mm: MultiModelGraph) -> list[str]:
    """Storable layers every config's frozen part passes through (each dominates every boundary), in order.

    HAPI's candidate split points for a multi-model graph: cutting after any of them, every config can compute the
    rest of its frozen layers from that one tensor. The last is HAPI's freeze index.
    """
    boundaries = {k for i in range(len(mm.models)) for k in boundary_keys(mm, i)}
    inputs = [k for k, node in mm.layers.items() if node.op == "placeholder"]
    children: dict[str, list[str]] = {k: [] for k in mm.layers}
    for k, ps in mm.parents.items():
        for p in ps:
            children[p].append(k)

    def reaches_a_boundary_without(cut: str) -> bool:
        seen, stack = set(), [k for k in inputs if k != cut]
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            if k in boundaries:
                return True
            stack.extend(c for c in children[k] if c != cut)
        return False

    return [
        k
        for k, node in mm.layers.items()
        if node.storable and node.op != "placeholder" and not reaches_a_boundary_without(k)
    ]


def extraction_memory(mm: MultiModelGraph, input_key: str, keys: Sequence[str]) -> tuple[int, int]:
    """(bytes per record, bytes of the model) of extracting ``keys`` from the input: the live-tensor estimate of a
    forward-only plan, at batch 1 and 2."""
    need = ancestors_or_self(mm, keys)
    actions = {k: (LOAD if k == input_key else COMPUTE) if k in need else PRUNE for k in mm.layers}
    plan = ReusePlan(actions, 0.0)
    one, two = estimate_peak_memory(mm, plan, 1), estimate_peak_memory(mm, plan, 2)
    return two - one, max(one - (two - one), 0)


def measure_split(transfer: EngineTransfer, x: torch.Tensor, *, repeats: int = 3) -> dict[str, Any]:
    """What near-data extraction costs and saves for ``transfer`` on records ``x`` (in-process, no Ray).

    ``bytes_per_record``: what leaves the data's side per record (the extracted features, or the raw record without
    ``extract``); ``extract_s``: the extraction's time over ``x`` (median of ``repeats``); ``branch_s``: one forward
    and backward of every config's branch over those features in its batch size (the frozen layers a config still
    computes land here); both the median of ``repeats``; ``batch``: the extraction batch size (None: all at once).
    """
    raw_bytes = x[:1].numel() * x.element_size()
    times, feats = [], x
    if transfer.extract is not None:
        with torch.no_grad():
            for _ in range(repeats):
                t0 = time.perf_counter()
                feats = transfer.extract(x)
                times.append(time.perf_counter() - t0)
    nbytes = (
        sum(v.numel() * v.element_size() for v in feats.values()) if isinstance(feats, Mapping)
        else feats.numel() * feats.element_size()
    )
    branches = [(transfer.model_fn(cfg)[0].train(), int(cfg.get("batch_size", 32))) for cfg in transfer.configs]
    branch_times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for branch, bs in branches:
            for s in range(0, len(x), bs):
                branch(take(feats, slice(s, s + bs))).float().sum().backward()
        branch_times.append(time.perf_counter() - t0)
    return {
        "split": transfer.split,
        "layers": len(transfer.split_keys),
        "bytes_per_record": nbytes / len(x) if transfer.extract is not None else raw_bytes,
        "raw_bytes_per_record": raw_bytes,
        "extract_s": float(np.median(times)) if times else 0.0,
        "branch_s": float(np.median(branch_times)),
        "batch": transfer.extract.batch_size if transfer.extract is not None else None,
    }


def hop_report(transfer: EngineTransfer) -> list[dict[str, Any]]:
    """Per config: the bytes a hop moves before (whole model) and after (trainable state only)."""
    rows = []
    for i, c in enumerate(transfer.configs):
        before, after = transfer.hop_bytes(i)
        rows.append({"config_id": i, "config": c, "hop_bytes_before": before, "hop_bytes_after": after})
    return rows


__all__ = [
    "BranchModelFn",
    "EngineTransfer",
    "FeatureBranch",
    "FeatureExtractor",
    "common_frozen_chain",
    "config_key",
    "extraction_memory",
    "feature_len",
    "measure_split",
    "hop_report",
    "take",
    "transfer_on_engine",
]
