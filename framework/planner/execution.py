"""Rewrite profiled models into the modules a plan runs (Nautilus' reuse plan models, Vista's staged extraction).

``KeyedModule(mm, inputs, outputs)`` is one fx graph over multi-model keys: it takes the tensors of ``inputs`` keys
(loaded features, or raw records) positionally and returns a tuple with the tensors of ``outputs`` keys, computing
only the layers on the paths between them; a layer shared by several models is computed once. Its submodules are
the original models' (parameters are shared, not copied), so training a branch trains the model itself.

Three uses:
- extractor: raw records -> materialized layers V (one pass produces several layers: Vista's staged extraction);
- bridge: loaded layers -> the materializable boundary a branch reads (frozen, no grad, eval semantics);
- branch: the boundary of one model -> its output (the trainable remainder).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx
from torch import nn

from framework.planner.multimodel import MultiModelGraph


def _needed(mm: MultiModelGraph, inputs: Sequence[str], outputs: Sequence[str]) -> set[str]:
    need, stack, stop = set(), list(outputs), set(inputs)
    while stack:
        k = stack.pop()
        if k in need or k in stop:
            continue
        if mm.layers[k].op == "placeholder":
            raise ValueError(f"layer {k!r} needs the raw input, which is not among the inputs {list(inputs)}")
        need.add(k)
        stack.extend(mm.parents[k])
    return need


class KeyedModule(nn.Module):
    """Computes ``outputs`` keys from ``inputs`` keys; modules behind materializable layers always run in eval mode."""

    def __init__(self, mm: MultiModelGraph, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        super().__init__()
        self.input_keys, self.output_keys = tuple(inputs), tuple(outputs)
        need = _needed(mm, inputs, outputs)
        graph = fx.Graph()
        env: dict[str, fx.Node] = {}
        for j, k in enumerate(self.input_keys):
            env[k] = graph.placeholder(f"in{j}")
        models_used: set[int] = set()
        self._frozen_targets: list[str] = []
        self._trained_targets: list[str] = []
        order = {k: n for n, k in enumerate(mm.layers)}  # keys are inserted in topological order per model
        for k in sorted(need, key=order.__getitem__):
            i, name = mm.owners[k][0]
            models_used.add(i)
            src = next(n for n in mm.models[i].gm.graph.nodes if n.name == name)
            by_name = {n.name: mm.keys[i][n.name] for n in src.all_input_nodes}
            new = graph.node_copy(src, lambda n, by_name=by_name: env[by_name[n.name]])
            if src.op in ("call_module", "get_attr"):
                new.target = f"m{i}.{src.target}"
                if src.op == "call_module":
                    bucket = self._frozen_targets if mm.layers[k].materializable else self._trained_targets
                    bucket.append(new.target)
            env[k] = new
        graph.output(tuple(env[k] for k in self.output_keys))
        root = nn.Module()
        for i in sorted(models_used):
            root.add_module(f"m{i}", mm.models[i].gm)
        self.gm = fx.GraphModule(root, graph)
        self.training = True

    def train(self, mode: bool = True) -> KeyedModule:
        # only the modules this graph calls: the source models are shared with other keyed modules
        self.training = mode
        for t in self._trained_targets:
            self.gm.get_submodule(t).train(mode)
        for t in self._frozen_targets:
            self.gm.get_submodule(t).eval()  # Definition 2.4 semantics: frozen prefixes are deterministic
        return self

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.gm(*xs)


def build_extractor(mm: MultiModelGraph, keys: Sequence[str]) -> KeyedModule:
    """Raw records -> the tensors of ``keys`` in one pass (staged extraction)."""
    inputs = [k for k in mm.layers if mm.layers[k].op == "placeholder"]
    return KeyedModule(mm, inputs[:1], keys)


def boundary_keys(mm: MultiModelGraph, i: int) -> tuple[str, ...]:
    return tuple(mm.keys[i][n] for n in mm.models[i].boundary())


def build_branch(mm: MultiModelGraph, i: int) -> KeyedModule:
    """The trainable remainder of model ``i``: boundary features -> output."""
    return KeyedModule(mm, boundary_keys(mm, i), [mm.output_key(i)])


def build_bridge(mm: MultiModelGraph, loaded: Sequence[str], models: Sequence[int]) -> KeyedModule:
    """Loaded layers -> the union of the boundaries of ``models`` (shared layers computed once)."""
    outs = list(dict.fromkeys(k for i in models for k in boundary_keys(mm, i)))
    needed_inputs = [k for k in loaded if k in _ancestors_or_self(mm, outs)]
    return KeyedModule(mm, needed_inputs, outs)


def _ancestors_or_self(mm: MultiModelGraph, keys: Sequence[str]) -> set[str]:
    seen, stack = set(), list(keys)
    while stack:
        k = stack.pop()
        if k not in seen:
            seen.add(k)
            stack.extend(mm.parents[k])
    return seen


def trainable_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Only the parameters that require grad (what a model hop must carry), plus the buffers of trainable modules."""
    out = {n: p.detach() for n, p in module.named_parameters() if p.requires_grad}
    for mname, m in module.named_modules():
        if any(p.requires_grad for p in m.parameters(recurse=False)):
            for bname, b in m.named_buffers(recurse=False):
                out[f"{mname}.{bname}" if mname else bname] = b
    return out


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())
