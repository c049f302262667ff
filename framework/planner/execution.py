"""Rewrite profiled models into the modules a plan runs (Nautilus' reuse plan models, one-pass feature extraction).

``KeyedModule(mm, inputs, outputs)`` is one fx graph over multi-model keys: it takes the tensors of ``inputs`` keys
(loaded features, or raw records) positionally and returns a tuple with the tensors of ``outputs`` keys, computing
only the layers on the paths between them; a layer shared by several models is computed once. Its submodules are
the original models' (parameters are shared, not copied), so training a branch trains the model itself.

Three uses:
- extractor: raw records -> materialized layers V (one pass produces several layers: the Eager plan; Vista's Staged
  plan, one stage at a time, is `TransferPlan.materialize(execution="staged")`);
- bridge: loaded layers -> the materializable boundary a branch reads (frozen, no grad, eval semantics);
- branch: the boundary of one model -> its output (the trainable remainder).

In-place layers (``ReLU(inplace=True)``) run in place unless the tensor they change still holds a value the graph
returns or reads later, or is one of its inputs: then they work on a copy (see ``_copies_needed``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx
from torch import nn

from framework.planner.multimodel import MultiModelGraph
from framework.planner.profile import _LeafTracer


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


def _copies_needed(
    mm: MultiModelGraph, order: Sequence[str], inputs: Sequence[str], outputs: Sequence[str]
) -> tuple[set[str], set[str]]:
    """(layers whose in-place operand must be a copy, inputs to copy on entry).

    A layer ``m`` that changes its operand's tensor in place (``relu(inplace=True)``, ``h.mul_(2)``) also changes
    every key whose value is that tensor or a view of it (the profile records which layers share storage). Its
    operand is copied first when such a key computed before ``m`` is still read after ``m`` (by a layer of another
    model sharing it), is returned, or is an input (the caller's tensor, a boundary other branches read). Inside
    one model the profile already routes later readers through ``m``, so a plain ResNet branch copies nothing.
    """
    pos = {k: -1 for k in inputs} | {k: t for t, k in enumerate(order)}
    group = {k: {k} for k in pos}  # keys whose tensors share storage
    for k in pos:
        i, _ = mm.owners[k][0]
        for a in (mm.keys[i][name] for name in mm.layers[k].aliases):
            if a in group and group[a] is not group[k]:
                merged = group[a] | group[k]
                for member in merged:
                    group[member] = merged
    readers: dict[str, list[str]] = {}
    for k in order:
        for p in mm.parents[k]:
            readers.setdefault(p, []).append(k)
    ins, outs = set(inputs), set(outputs)

    def exposed(k: str, m: str) -> bool:
        return k in ins or k in outs or any(r != m and pos[r] > pos[m] for r in readers.get(k, ()))

    copy_operand: set[str] = set()
    copy_input: set[str] = set()
    for m in order:
        node = mm.layers[m]
        i, _ = mm.owners[m][0]
        changed = [mm.keys[i][v] for v in node.mutates]
        if (
            node.inplace_of is not None
            and not node.mutates_views
            and any(
                exposed(a, m) for k in changed for a in group.get(k, {k}) if a != m and pos.get(a, len(pos)) < pos[m]
            )
        ):
            copy_operand.add(m)
        # a change through a view must reach the base (so no copy of the operand); only the caller's tensor is
        # protected: profile keeps such a base private to its model and orders its later readers after ``m``
        copy_input |= {k for k in (mm.keys[i][v] for v in node.mutates_views) if k in ins}
    return copy_operand, copy_input


class KeyedModule(nn.Module):
    """Computes ``outputs`` keys from ``inputs`` keys; modules behind materializable layers always run in eval mode.

    Every returned tensor is the value its key names (a layer's output when it ran), even where a later layer of the
    graph works in place; inputs are never changed.
    """

    def __init__(self, mm: MultiModelGraph, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        super().__init__()
        self.input_keys, self.output_keys = tuple(inputs), tuple(outputs)
        need = _needed(mm, inputs, outputs)
        order = {k: n for n, k in enumerate(mm.layers)}  # keys are inserted in topological order per model
        ordered = sorted(need, key=order.__getitem__)
        copy_operand, copy_input = _copies_needed(mm, ordered, self.input_keys, self.output_keys)
        graph = fx.Graph(tracer_cls=_LeafTracer)  # unpickling re-traces the code: keep leaf calls and constants as they are
        env: dict[str, fx.Node] = {}
        for j, k in enumerate(self.input_keys):
            env[k] = graph.placeholder(f"in{j}")
            if k in copy_input:
                env[k] = graph.call_method("clone", (env[k],))
        models_used: set[int] = set()
        self._frozen_targets: list[str] = []
        self._trained_targets: list[str] = []
        for k in ordered:
            i, name = mm.owners[k][0]
            models_used.add(i)
            src = next(n for n in mm.models[i].gm.graph.nodes if n.name == name)
            by_name = {n.name: mm.keys[i][n.name] for n in src.all_input_nodes}
            arg_env = env
            if k in copy_operand:  # this layer changes a tensor whose old value is still needed: give it a copy
                operand = by_name[mm.layers[k].inplace_of]
                arg_env = {**env, operand: graph.call_method("clone", (env[operand],))}
            new = graph.node_copy(src, lambda n, by_name=by_name, arg_env=arg_env: arg_env[by_name[n.name]])
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
    """Raw records -> the tensors of ``keys`` in one pass (the Eager plan).

    It takes every model input, in the order of the models' placeholders (one tensor for one-input models).
    """
    inputs = [k for k in mm.layers if mm.layers[k].op == "placeholder"]
    return KeyedModule(mm, inputs, keys)


def boundary_keys(mm: MultiModelGraph, i: int) -> tuple[str, ...]:
    return tuple(mm.keys[i][n] for n in mm.models[i].boundary())


def build_branch(mm: MultiModelGraph, i: int) -> KeyedModule:
    """The trainable remainder of model ``i``: boundary features -> output."""
    return KeyedModule(mm, boundary_keys(mm, i), [mm.output_key(i)])


def build_bridge(mm: MultiModelGraph, loaded: Sequence[str], models: Sequence[int]) -> KeyedModule:
    """Loaded layers -> the union of the boundaries of ``models`` (shared layers computed once)."""
    outs = list(dict.fromkeys(k for i in models for k in boundary_keys(mm, i)))
    needed_inputs = [k for k in loaded if k in ancestors_or_self(mm, outs)]
    return KeyedModule(mm, needed_inputs, outs)


def ancestors_or_self(mm: MultiModelGraph, keys: Sequence[str]) -> set[str]:
    """`keys` and every layer they are computed from, in the multi-model graph."""
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
