"""Profile a model into a layer graph with torch.fx (Nautilus section 2 and 4.1).

A *layer* is one node of the fx graph: a leaf module call, a function call (``x + y``, ``torch.cat``), a method call
or a parameter access. Per node we record, normalised to one record:

- ``flops``: forward FLOPs. Convention: ``2 * MACs`` for matmul/conv/attention as counted by
  ``torch.utils.flop_counter.FlopCounterMode``; an op that the counter does not cover (element-wise, norms, pooling)
  counts one FLOP per output element. Backward cost is derived by the cost model (2x / 3x of forward).
- ``out_bytes``: bytes of the node's output tensor (the size on disk if materialized).
- ``act_bytes``: bytes of every tensor the node's ops produce (Nautilus' s_mem of a composite layer: the sum of its
  children's outputs), used by the live-tensor memory estimator.
- ``param_bytes``, ``frozen`` (no parameter requires grad), ``materializable`` (Definition 2.4: an input, or a frozen
  node whose parents are all materializable).

Per-record values are measured as the difference between a run on 3 records and a run on 2 records, so constant
terms (parameters, positional tables) cancel and a tensor is *per-record* iff its first dimension is the batch.

Materializable layers are evaluated with eval-mode semantics (dropout off, batch norm on running statistics): the
executor keeps the modules behind materializable nodes in eval mode, so their outputs are deterministic.

``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` are traced as leaf modules: their forward branches on
tensor properties for the fused "fast path", which symbolic tracing cannot follow. The fast path is also switched
off while profiling (``torch.backends.mha.set_fastpath_enabled(False)``) so the flop counter sees the real matmuls.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

DEFAULT_LEAF_MODULES: tuple[type[nn.Module], ...] = (nn.TransformerEncoderLayer, nn.MultiheadAttention)


@dataclass(frozen=True)
class LayerNode:
    """One layer of a profiled model (all sizes and FLOPs per record)."""

    name: str
    op: str  # fx op: placeholder, call_module, call_function, call_method, get_attr, output
    parents: tuple[str, ...]
    flops: float
    out_bytes: float
    act_bytes: float
    param_bytes: int
    trainable_param_bytes: int
    frozen: bool
    materializable: bool
    per_record: bool  # the output is a tensor whose first dimension is the batch (so it can be stored per record)
    signature: str  # identical sub-expression key: op, configuration, parameter values and input signatures

    @property
    def storable(self) -> bool:
        return self.materializable and self.per_record


@dataclass
class LayerGraph:
    """A model's layer DAG; ``gm`` is the traced module (it shares parameters with the original model)."""

    gm: fx.GraphModule
    nodes: dict[str, LayerNode]  # topological order
    inputs: tuple[str, ...]
    output: str  # the node whose value the model returns
    children: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        kids: dict[str, list[str]] = {n: [] for n in self.nodes}
        for node in self.nodes.values():
            for p in node.parents:
                kids[p].append(node.name)
        self.children = {n: tuple(k) for n, k in kids.items()}

    def total_flops(self) -> float:
        return sum(n.flops for n in self.nodes.values())

    def boundary(self) -> tuple[str, ...]:
        """Materializable nodes that feed a non-materializable node or are the output: what a branch reads."""
        out = []
        for name, node in self.nodes.items():
            if not node.materializable:
                continue
            if name == self.output or any(not self.nodes[c].materializable for c in self.children[name]):
                out.append(name)
        return tuple(out)


class _LeafTracer(fx.Tracer):
    def __init__(self, leaf_modules: tuple[type[nn.Module], ...]) -> None:
        super().__init__()
        self._leaf_types = leaf_modules

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, self._leaf_types) or super().is_leaf_module(m, qualname)


def trace(model: nn.Module, leaf_modules: tuple[type[nn.Module], ...] = DEFAULT_LEAF_MODULES) -> fx.GraphModule:
    tracer = _LeafTracer(leaf_modules)
    graph = tracer.trace(model)
    return fx.GraphModule(model, graph, model.__class__.__name__)


@contextlib.contextmanager
def no_mha_fastpath() -> Iterator[None]:
    """Disable the fused transformer fast path (numerics then match training mode's math path)."""
    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(prev)


class _BytesCounter(TorchDispatchMode):
    """Sums the bytes of every tensor produced by aten ops (intermediates of composite layers included)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.bytes += t.numel() * t.element_size()
        return out


@dataclass
class _NodeRun:
    flops: float
    out_bytes: float
    act_bytes: float
    batch_dim: bool


class _ProfilingInterpreter(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, batch: int) -> None:
        super().__init__(gm)
        self.batch = batch
        self.runs: dict[str, _NodeRun] = {}

    def run_node(self, n: fx.Node):  # noqa: ANN201
        counter = FlopCounterMode(display=False)
        acts = _BytesCounter()
        with counter, acts:
            out = super().run_node(n)
        flops = float(counter.get_total_flops())
        is_tensor = isinstance(out, torch.Tensor)
        out_bytes = float(out.numel() * out.element_size()) if is_tensor else 0.0
        if flops == 0.0 and is_tensor and n.op not in ("placeholder", "get_attr", "output"):
            flops = float(out.numel())  # element-wise convention
        batch_dim = is_tensor and out.dim() > 0 and out.shape[0] == self.batch
        self.runs[n.name] = _NodeRun(flops, out_bytes, float(acts.bytes), batch_dim)
        return out


_HASH_CACHE: dict[tuple[int, int, tuple[int, ...], str], str] = {}


def _hash_tensor(t: torch.Tensor) -> str:
    # cached by storage address and in-place version counter: models sharing one backbone hash it once
    key = (t.data_ptr(), t._version, tuple(t.shape), str(t.dtype))
    if key not in _HASH_CACHE:
        c = t.detach().contiguous().cpu()
        data = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
        _HASH_CACHE[key] = hashlib.sha1(str(key[2:]).encode() + data).hexdigest()
    return _HASH_CACHE[key]


def _hash_tensors(tensors: Sequence[torch.Tensor]) -> str:
    return hashlib.sha1("".join(_hash_tensor(t) for t in tensors).encode()).hexdigest()


def _arg_repr(a: object, sigs: dict[str, str]) -> str:
    if isinstance(a, fx.Node):
        return f"<{sigs[a.name]}>"
    if isinstance(a, (tuple, list)):
        return "(" + ",".join(_arg_repr(x, sigs) for x in a) + ")"
    if isinstance(a, dict):
        return "{" + ",".join(f"{k}:{_arg_repr(v, sigs)}" for k, v in sorted(a.items())) + "}"
    return repr(a)


def _signature(n: fx.Node, gm: fx.GraphModule, sigs: dict[str, str], input_index: int) -> str:
    args = _arg_repr(n.args, sigs) + _arg_repr(n.kwargs, sigs)
    if n.op == "placeholder":
        body = f"input{input_index}"
    elif n.op == "call_module":
        mod = gm.get_submodule(str(n.target))
        tensors = list(mod.parameters()) + list(mod.buffers())
        body = f"module:{type(mod).__qualname__}:{mod.extra_repr()}:{_hash_tensors(tensors)}"
    elif n.op == "get_attr":
        attr = gm
        for part in str(n.target).split("."):
            attr = getattr(attr, part)
        body = f"attr:{_hash_tensors([attr]) if isinstance(attr, torch.Tensor) else repr(attr)}"
    elif n.op == "call_function":
        target = n.target
        body = f"fn:{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', repr(target))}"
    else:
        body = f"{n.op}:{n.target}"
    return hashlib.sha1(f"{body}|{args}".encode()).hexdigest()


def _node_params(n: fx.Node, gm: fx.GraphModule) -> list[torch.Tensor]:
    if n.op == "call_module":
        return list(gm.get_submodule(str(n.target)).parameters())
    if n.op == "get_attr":
        attr = gm
        for part in str(n.target).split("."):
            attr = getattr(attr, part)
        return [attr] if isinstance(attr, nn.Parameter) else []
    return []


def profile_model(
    model: nn.Module,
    example_input: torch.Tensor,
    leaf_modules: tuple[type[nn.Module], ...] = DEFAULT_LEAF_MODULES,
) -> LayerGraph:
    """Trace ``model`` and profile every layer; ``example_input`` holds one or more records (first one is used).

    The model must take one tensor (a batch of records) and return one tensor. Profiling runs on a copy in eval mode,
    under ``no_grad``, so batch-norm statistics and the model itself are untouched.
    """
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 1 or example_input.shape[0] < 1:
        raise ValueError(
            f"`example_input` is {type(example_input).__name__}, but must be a tensor with at least one record"
        )
    gm = trace(model, leaf_modules)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise ValueError(f"model takes {len(placeholders)} inputs, but the planner supports exactly one")
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    if not isinstance(out_node.args[0], fx.Node):
        raise ValueError("model returns a container, but the planner supports one output tensor")

    was_training = model.training
    record = example_input[:1]
    runs = {}
    try:
        gm.eval()
        with torch.no_grad(), no_mha_fastpath():
            for b in (2, 3):
                interp = _ProfilingInterpreter(gm, b)
                interp.run(record.expand(b, *record.shape[1:]).contiguous())
                runs[b] = interp.runs
    finally:
        gm.train(was_training)
        model.train(was_training)

    nodes: dict[str, LayerNode] = {}
    sigs: dict[str, str] = {}
    for idx, n in enumerate(n for n in gm.graph.nodes if n.op != "output"):
        r2, r3 = runs[2][n.name], runs[3][n.name]
        params = _node_params(n, gm)
        frozen = not any(p.requires_grad for p in params)
        parents = tuple(p.name for p in n.all_input_nodes)
        mat = n.op == "placeholder" or (frozen and all(nodes[p].materializable for p in parents))
        sigs[n.name] = _signature(n, gm, sigs, idx)
        per_record = r2.batch_dim and r3.batch_dim
        nodes[n.name] = LayerNode(
            name=n.name,
            op=n.op,
            parents=parents,
            flops=max(r3.flops - r2.flops, 0.0),
            out_bytes=(r3.out_bytes - r2.out_bytes) if per_record else 0.0,
            act_bytes=max(r3.act_bytes - r2.act_bytes, 0.0),
            param_bytes=sum(p.numel() * p.element_size() for p in params),
            trainable_param_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
            frozen=frozen,
            materializable=mat,
            per_record=per_record,
            signature=sigs[n.name],
        )
    return LayerGraph(gm=gm, nodes=nodes, inputs=tuple(p.name for p in placeholders), output=out_node.args[0].name)
