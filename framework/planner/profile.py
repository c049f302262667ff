"""Profile a model into a layer graph with torch.fx (Nautilus section 2 and 4.1).

A *layer* is one node of the fx graph: a leaf module call, a function call (``x + y``, ``torch.cat``), a method call
or a parameter access. Per node we record, normalised to one record:

- ``flops``: forward FLOPs. Convention: ``2 * MACs`` for matmul/conv/attention as counted by
  ``torch.utils.flop_counter.FlopCounterMode``; an op that the counter does not cover (element-wise, norms, pooling)
  counts one FLOP per output element. Backward cost is derived by the cost model (2x / 3x of forward). ResNet-18
  at 224 x 224 comes to 3.63e9 (its published 1.81 GMACs, times 2).
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

Inputs and outputs. ``example_input`` is a tensor, a tuple of tensors (the first positional arguments of
``forward``) or a dict of tensors (arguments by name); each becomes one placeholder and the other arguments are
fixed at their defaults (``concrete_args``). A ``forward(**kwargs)`` root (HF models) is traced through a small
module that calls it by keyword. A returned container (dict, tuple) becomes one ``_model_output`` node, an HF
``ModelOutput`` one node that rebuilds it, so every graph has one output layer.

HuggingFace models. transformers 5 removed its fx tracer (``transformers.utils.fx.HFTracer``), so plain
``torch.fx`` traces them with two kinds of opaque calls, found by ``huggingface_leaves(model)`` and added by default:

- leaf modules: the blocks every ``PreTrainedModel`` lists in ``_no_split_modules`` (BERT: ``BertEmbeddings``,
  ``BertLayer``). These are the units the model's authors keep whole; they are also the granularity transfer
  learning freezes at (embeddings, then encoder blocks), so a layer of the graph is a block.
- leaf functions: ``transformers.masking_utils.create_*_mask``, which branch on the mask's values (and return
  ``None`` when nothing is padded). They are patched, while tracing, in the globals of the modules that call them
  (tracing is therefore not thread-safe) and recorded as one ``_call_leaf("module:name", ...)`` node; their
  non-tensor arguments (the config) become attributes of the traced module. Their results are never stored.

Why not the alternatives: ``torch.export`` gives an ATen-level graph with lifted parameters that cannot switch
train/eval mode (the branches train, the frozen prefix runs in eval mode) and loses the module boundaries that
layer keys and freezing rely on; ``concrete_args`` alone cannot get past the mask code, which reads tensor values;
tracing inside the blocks follows code paths HF changes between releases. Leaf blocks depend only on the documented
``_no_split_modules`` and on the block's call signature.

In-place operations (``ReLU(inplace=True)``, ``h.mul_(2)``). fx records them as layers whose output *is* their
operand's tensor, so the operand's key would name a value that changes later. The profiler watches tensor version
counters while it runs and records per layer which earlier layers it changed (``mutates``, through a view:
``mutates_views``) and which parent it changed and returned (``inplace_of``). A key always names a layer's value
*when the layer ran*: readers of the operand after the change are rewired to read the in-place layer (the same
tensor), execution copies the operand first where the old value is still needed (``execution.KeyedModule``), and a
tensor changed through a view stays private to its model (not materializable), its later readers ordered after the
change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import inspect
import keyword
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

DEFAULT_LEAF_MODULES: tuple[type[nn.Module], ...] = (nn.TransformerEncoderLayer, nn.MultiheadAttention)
ExampleInput = torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
_HF_MASK_FUNCTIONS = (
    "create_bidirectional_mask",
    "create_causal_mask",
    "create_sliding_window_causal_mask",
    "create_chunked_causal_mask",
    "create_masks_for_generate",
)


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
    mutates: tuple[str, ...] = ()  # earlier layers whose tensor this layer changes in place and returns (relu_, +=)
    mutates_views: tuple[str, ...] = ()  # earlier layers it changes through a view or base of their tensor
    inplace_of: str | None = None  # the parent whose tensor it changes and returns; None: not in place
    aliases: tuple[str, ...] = ()  # earlier layers whose tensor shares storage with this one's (a view, the same)

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


_PLAIN_ARGS = (
    torch.Tensor,
    fx.Node,
    str,
    int,
    float,
    bool,
    complex,
    slice,
    tuple,
    list,
    dict,
    torch.dtype,
    torch.device,
)


class _LeafTracer(fx.Tracer):
    """``torch.fx`` tracer with opaque leaf modules and leaf functions (see the module docstring)."""

    def __init__(
        self,
        leaf_modules: tuple[type[nn.Module], ...] = DEFAULT_LEAF_MODULES,
        leaf_functions: tuple[Callable[..., Any], ...] = (),
    ) -> None:
        super().__init__()
        self._leaf_types = leaf_modules
        self.leaf_functions = leaf_functions
        self.constants: dict[str, Any] = {}  # get_attr name -> a non-tensor argument of a leaf-function call
        self._paths: dict[int, str] | None = None  # id -> attribute path of the root's leaf constants

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, self._leaf_types) or super().is_leaf_module(m, qualname)

    def create_arg(self, a: Any) -> Any:
        # fx turns a dict subclass into a plain dict; an HF ModelOutput (a dataclass dict) is rebuilt as itself
        if isinstance(a, dict) and type(a) is not dict and dataclasses.is_dataclass(a):
            return self.create_node("call_function", type(a), (), {k: self.create_arg(v) for k, v in a.items()})
        if not isinstance(a, _PLAIN_ARGS) and a is not None and id(a) in self._constant_paths():
            # re-tracing an unpickled module: a leaf constant is its attribute again (fx would rebuild a dataclass
            # config from its fields and lose its private settings, such as the attention implementation)
            return self.create_node("get_attr", self._constant_paths()[id(a)], (), {})
        return super().create_arg(a)

    def _constant_paths(self) -> dict[int, str]:
        if self._paths is None:
            self._paths = {
                id(v): f"{prefix}.{k}" if prefix else k
                for prefix, mod in self.root.named_modules()
                for k, v in vars(mod).items()
                if k.startswith("_leaf_constant_")
            }
        return self._paths

    def _constant(self, a: Any) -> Any:
        if isinstance(a, (fx.Proxy, *_PLAIN_ARGS)) or a is None:
            return a
        name = next((k for k, v in self.constants.items() if v is a), f"_leaf_constant_{len(self.constants)}")
        self.constants[name] = a
        return self.create_proxy("get_attr", name, (), {})

    def opaque(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as one ``_call_leaf`` node when it sees a traced value; called as is otherwise."""

        def call(*args: Any, **kwargs: Any) -> Any:
            if not any(isinstance(a, fx.Proxy) for a in pytree.tree_leaves((args, kwargs))):
                return fn(*args, **kwargs)
            args, kwargs = pytree.tree_map(self._constant, (args, kwargs))
            return self.create_proxy("call_function", _call_leaf, (_qualname(fn), *args), kwargs)

        return call


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


@functools.cache
def _resolve(qualname: str) -> Callable[..., Any]:
    module, _, name = qualname.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _retraced(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> fx.Proxy | None:
    # fx re-traces a GraphModule's code when it is unpickled: these helpers then stay one node each
    proxy = next((a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, fx.Proxy)), None)
    return None if proxy is None else proxy.tracer.create_proxy("call_function", fn, args, kwargs)


def _call_leaf(qualname: str, *args: Any, **kwargs: Any) -> Any:
    """Runs a leaf function named by ``module:qualname`` (a name, not the function, so graphs pickle)."""
    traced = _retraced(_call_leaf, (qualname, *args), kwargs)
    return traced if traced is not None else _resolve(qualname)(*args, **kwargs)


def _model_output(structure: Any) -> Any:
    """The model's returned container (dict, tuple, list) as one node, so a graph always has one output layer."""
    traced = _retraced(_model_output, (structure,), {})
    return traced if traced is not None else structure


@contextlib.contextmanager
def _patched_leaf_functions(tracer: _LeafTracer, model: nn.Module) -> Iterator[None]:
    # a function is looked up in the globals of the module that calls it: patch it there, for every module class
    # the model is built from (HF's modeling_bert imports create_bidirectional_mask by name)
    fns = tracer.leaf_functions
    spaces = {type(m).__module__ for m in model.modules()}
    saved: list[tuple[dict[str, Any], str, Any]] = []
    try:
        for modname in sorted(spaces):
            space = vars(sys.modules[modname]) if modname in sys.modules else {}
            for name, value in list(space.items()):
                if any(value is f for f in fns):
                    saved.append((space, name, value))
                    space[name] = tracer.opaque(value)
        yield
    finally:
        for space, name, value in reversed(saved):
            space[name] = value


def huggingface_leaves(model: nn.Module) -> tuple[tuple[type[nn.Module], ...], tuple[Callable[..., Any], ...]]:
    """Leaf modules and functions that let plain ``torch.fx`` trace a model holding HuggingFace transformers.

    The leaf modules are the blocks each ``transformers.PreTrainedModel`` inside ``model`` declares in
    ``_no_split_modules`` (BERT: ``BertEmbeddings``, ``BertLayer``); the leaf functions are transformers' attention
    mask builders (``masking_utils.create_*_mask``), which branch on tensor values. ``((), ())`` when there is none.
    """
    blocks: set[type[nn.Module]] = set()
    for m in model.modules():
        names = getattr(type(m), "_no_split_modules", None)
        if names and type(m).__module__.startswith("transformers."):
            blocks |= {type(s) for s in m.modules() if type(s).__name__ in set(names)}
    if not blocks:
        return (), ()
    try:
        from transformers import masking_utils
    except ImportError:
        fns: tuple[Callable[..., Any], ...] = ()
    else:
        fns = tuple(getattr(masking_utils, n) for n in _HF_MASK_FUNCTIONS if hasattr(masking_utils, n))
    return tuple(sorted(blocks, key=lambda t: f"{t.__module__}.{t.__qualname__}")), fns


def _erase_specialized_inputs(graph: fx.Graph, inputs: Sequence[str]) -> None:
    # concrete_args leave placeholders with defaults and assertions on them; the traced code never reads them
    doomed: dict[fx.Node, None] = {}
    stack = [n for n in graph.nodes if n.op == "placeholder" and n.target not in inputs]
    while stack:
        n = stack.pop()
        if n not in doomed:
            if n.op == "output":
                raise ValueError(f"the model returns its argument {n.name!r}, which the example did not give")
            doomed[n] = None
            stack.extend(n.users)
    for n in reversed([n for n in graph.nodes if n in doomed]):
        graph.erase_node(n)


def _pack_container_output(graph: fx.Graph) -> None:
    out = next(n for n in graph.nodes if n.op == "output")
    if not isinstance(out.args[0], fx.Node):
        with graph.inserting_before(out):
            packed = graph.call_function(_model_output, (out.args[0],))
        out.args = (packed,)


def _keyword_root(model: nn.Module, names: Sequence[str]) -> nn.Module:
    """A module calling ``model(name=name, ...)``: fx cannot trace a root ``forward(..., **kwargs)`` (HF models)."""
    bad = [n for n in names if not n.isidentifier() or keyword.iskeyword(n)]
    if bad:
        raise ValueError(f"`example_input` has the keys {bad}, but keys must be Python identifiers")
    src = f"def forward(self, {', '.join(names)}):\n    return self.model({', '.join(f'{n}={n}' for n in names)})\n"
    space: dict[str, Any] = {}
    exec(compile(src, "<keyword_root>", "exec"), space)  # noqa: S102 - names checked to be identifiers
    root = type("KeywordCall", (nn.Module,), {"forward": space["forward"]})()
    root.model = model
    return root


def trace(
    model: nn.Module,
    leaf_modules: tuple[type[nn.Module], ...] = DEFAULT_LEAF_MODULES,
    *,
    leaf_functions: tuple[Callable[..., Any], ...] = (),
    concrete_args: dict[str, Any] | None = None,
    inputs: Sequence[str] | None = None,
) -> fx.GraphModule:
    """Symbolically trace ``model``: ``inputs`` (parameter names) become placeholders, ``concrete_args`` are fixed.

    A container output (dict, tuple) becomes one ``_model_output`` node; a leaf function call one ``_call_leaf``
    node, whose non-tensor arguments (a config object) are attributes of the returned module.
    """
    tracer = _LeafTracer(tuple(leaf_modules), tuple(leaf_functions))
    with _patched_leaf_functions(tracer, model):
        graph = tracer.trace(model, concrete_args=concrete_args or None)
    if inputs is not None:
        _erase_specialized_inputs(graph, inputs)
    _pack_container_output(graph)
    for n in graph.nodes:  # a string annotation (`from __future__ import annotations`) would not pickle
        if isinstance(n.type, str):
            n.type = None
    if not tracer.constants:
        return fx.GraphModule(model, graph, model.__class__.__name__)
    root: dict[str, Any] = dict(tracer.constants)
    for n in graph.nodes:
        if n.op in ("call_module", "get_attr") and n.target not in root:
            obj: Any = model
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            root[str(n.target)] = obj
    return fx.GraphModule(root, graph, model.__class__.__name__)


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


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (
        a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
    )


class _ProfilingInterpreter(fx.Interpreter):
    """Runs the graph node by node, counting FLOPs and bytes; with ``track_mutations`` it also records which earlier
    outputs each node changed in place (their version counters moved: views share their base's counter)."""

    def __init__(self, gm: fx.GraphModule, batch: int, track_mutations: bool = False) -> None:
        super().__init__(gm)
        self.batch = batch
        self.runs: dict[str, _NodeRun] = {}
        self.track = track_mutations
        self._seen: dict[str, list[tuple[torch.Tensor, int]]] = {}  # node -> its output tensors and their versions
        self._storages: dict[str, set[int]] = {}  # node -> the storages its output tensors live in
        self.mutates: dict[str, list[str]] = {}  # node -> earlier nodes whose (identical) tensor it changed
        self.mutates_views: dict[str, list[str]] = {}  # node -> earlier nodes it changed through a view or base
        self.inplace_of: dict[str, str] = {}  # node -> the parent whose tensor it changed and returned
        self.aliases: dict[str, list[str]] = {}  # node -> earlier nodes whose tensors share its storage (views)

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
        if self.track:
            self._track(n, out)
        return out

    def _track(self, n: fx.Node, out: object) -> None:
        for name, seen in self._seen.items():
            if all(t._version == v for t, v in seen):
                continue
            self._seen[name] = [(t, t._version) for t, _ in seen]
            same = isinstance(out, torch.Tensor) and any(_same_tensor(t, out) for t, _ in seen)
            (self.mutates if same else self.mutates_views).setdefault(n.name, []).append(name)
        if n.name in self.mutates:
            assert isinstance(out, torch.Tensor)
            parent = next(
                (p.name for p in n.all_input_nodes if any(_same_tensor(t, out) for t, _ in self._seen.get(p.name, ()))),
                None,
            )
            if parent is None:  # it returned a tensor it did not get: treat like a change through a view
                self.mutates_views.setdefault(n.name, []).extend(self.mutates.pop(n.name))
            else:
                self.inplace_of[n.name] = parent
        tensors = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if tensors and n.op != "output":
            storages = {t.untyped_storage().data_ptr() for t in tensors if t.numel()}
            self.aliases[n.name] = [name for name, other in self._storages.items() if other & storages]
            self._seen[n.name] = [(t, t._version) for t in tensors]
            self._storages[n.name] = storages


# id(tensor) -> (a weak reference to it, its address, version, shape and dtype when hashed, the hash): models that
# share one backbone hash it once. An entry counts only for the very tensor it was made for (and goes when that
# tensor does): an address alone is reused once a tensor is freed, and a new tensor there must never inherit the old
# one's hash (identical layers would stop merging, and different ones could merge).
_HASH_CACHE: dict[int, tuple[weakref.ref, tuple, str]] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _HASH_CACHE.get(key)
    if entry is not None and entry[0] is ref:
        del _HASH_CACHE[key]


def _hash_tensor(t: torch.Tensor) -> str:
    stamp = (t.data_ptr(), t._version, tuple(t.shape), str(t.dtype))
    cached = _HASH_CACHE.get(id(t))
    if cached is not None and cached[0]() is t and cached[1] == stamp:
        return cached[2]
    c = t.detach().contiguous().cpu()
    data = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
    digest = hashlib.sha1(str(stamp[2:]).encode() + data).hexdigest()
    key = id(t)
    ref = weakref.ref(t, lambda r, k=key: _forget(k, r))
    _HASH_CACHE[key] = (ref, stamp, digest)
    return digest


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


def _bind_example(
    model: nn.Module, example_input: ExampleInput
) -> tuple[list[str], list[torch.Tensor], dict[str, Any], bool]:
    """(input names, their tensors, concrete values of the other arguments, whether to call by keyword)."""
    if isinstance(example_input, torch.Tensor):
        positional, named = [example_input], {}
    elif isinstance(example_input, Mapping):
        positional, named = [], dict(example_input)
    elif isinstance(example_input, (tuple, list)):
        positional, named = list(example_input), {}
    else:
        positional, named = [], {}
    values = [*positional, *named.values()]
    if not values or any(not isinstance(v, torch.Tensor) or v.dim() < 1 or v.shape[0] < 1 for v in values):
        raise ValueError(
            f"`example_input` is {type(example_input).__name__}, but must be a tensor, a tuple of tensors or a dict "
            "of tensors, each with at least one record"
        )
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # no signature: trace as is
        return [], values, {}, False
    kind = inspect.Parameter
    var = any(p.kind in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD) for p in params)
    named_params = [
        p for p in params if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD, kind.KEYWORD_ONLY)
    ]
    positional_params = [p for p in named_params if p.kind != kind.KEYWORD_ONLY]
    forward = f"{type(model).__name__}.forward"
    if len(positional) > len(positional_params):
        raise ValueError(
            f"`example_input` holds {len(positional)} tensors, but {forward} takes {len(positional_params)} "
            "positional arguments"
        )
    names = [p.name for p in positional_params[: len(positional)]]
    known = {p.name for p in named_params}
    unknown = [k for k in named if k not in known]
    if unknown and not any(p.kind == kind.VAR_KEYWORD for p in params):
        raise ValueError(f"`example_input` has the keys {unknown}, but {forward} takes {sorted(known)}")
    names += list(named)
    if var:  # fx cannot hand a root *args/**kwargs a proxy: trace a keyword call; the model fills its defaults
        return names, values, {}, True
    concrete = {}
    for p in named_params:
        if p.name not in names:
            if p.default is kind.empty:
                raise ValueError(f"`example_input` gives no `{p.name}`, which {forward} needs (it has no default)")
            concrete[p.name] = p.default
    return names, values, concrete, False


def _rewire_inplace(gm: fx.GraphModule, mutates: Mapping[str, Sequence[str]]) -> None:
    # a reader of x after `y = x.relu_()` (same tensor) reads y: the graph's edges then carry the data flow, and
    # the key of x stays its value before the change
    order = {n.name: t for t, n in enumerate(gm.graph.nodes)}
    by_name = {n.name: n for n in gm.graph.nodes}
    for m, victims in mutates.items():
        for v in victims:
            for user in list(by_name[v].users):
                if user.name != m and order[user.name] > order[m]:
                    user.replace_input_with(by_name[v], by_name[m])
    gm.graph.lint()
    gm.recompile()


def profile_model(
    model: nn.Module,
    example_input: ExampleInput,
    leaf_modules: tuple[type[nn.Module], ...] = DEFAULT_LEAF_MODULES,
    *,
    leaf_functions: tuple[Callable[..., Any], ...] = (),
    huggingface: bool = True,
) -> LayerGraph:
    """Trace ``model`` and profile every layer; ``example_input`` holds one or more records (first one is used).

    ``example_input`` is a tensor (one input), a tuple of tensors (the first positional arguments) or a dict of
    tensors (arguments by name; the other arguments keep their defaults); each tensor is one placeholder, with the
    batch as its first dimension. The model may return a tensor or a container (dict, tuple, HF ``ModelOutput``),
    which becomes one output layer. ``leaf_modules`` and ``leaf_functions`` are traced as opaque calls; with
    ``huggingface`` the blocks and mask builders of ``huggingface_leaves(model)`` are added. Profiling runs in eval
    mode, under ``no_grad``; every module's training flag is restored afterwards.
    """
    names, tensors, concrete, by_keyword = _bind_example(model, example_input)
    leaves, fns = tuple(leaf_modules), tuple(leaf_functions)
    if huggingface:
        hf_modules, hf_functions = huggingface_leaves(model)
        leaves += tuple(t for t in hf_modules if t not in leaves)
        fns += tuple(f for f in hf_functions if f not in fns)
    root = _keyword_root(model, names) if by_keyword else model
    gm = trace(root, leaves, leaf_functions=fns, concrete_args=concrete, inputs=names or None)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    given = dict(zip(names, tensors, strict=True)) if names else {}
    if given and sorted(str(p.target) for p in placeholders) != sorted(given):
        raise ValueError(f"model takes the inputs {[p.target for p in placeholders]}, but the example gives {names}")
    if not given and len(placeholders) != len(tensors):
        raise ValueError(f"model takes {len(placeholders)} inputs, but the example gives {len(tensors)}")
    ordered = [given[str(p.target)] for p in placeholders] if given else tensors

    modes = {m: m.training for m in model.modules()}
    runs = {}
    try:
        gm.eval()
        with torch.no_grad(), no_mha_fastpath():
            for b in (2, 3):
                interp = _ProfilingInterpreter(gm, b, track_mutations=b == 2)
                interp.run(*(t[:1].expand(b, *t.shape[1:]).contiguous() for t in ordered))
                runs[b] = interp.runs
                if b == 2:
                    tracked = interp
    finally:
        gm.train(model.training)
        for m, mode in modes.items():
            m.training = mode
    _rewire_inplace(gm, tracked.mutates)
    # a reader of x after a change through a view of x: it depends on that change, and x is private to the model
    extra: dict[str, list[str]] = {}
    private: set[str] = set()
    order = {n.name: t for t, n in enumerate(gm.graph.nodes)}
    by_name = {n.name: n for n in gm.graph.nodes}
    for m, victims in tracked.mutates_views.items():
        for v in victims:
            if by_name[v].op != "placeholder":
                private.add(v)
            for user in by_name[v].users:
                if order[user.name] > order[m]:
                    extra.setdefault(user.name, []).append(m)

    nodes: dict[str, LayerNode] = {}
    sigs: dict[str, str] = {}
    for idx, n in enumerate(n for n in gm.graph.nodes if n.op != "output"):
        r2, r3 = runs[2][n.name], runs[3][n.name]
        params = _node_params(n, gm)
        frozen = not any(p.requires_grad for p in params)
        parents = tuple(dict.fromkeys([p.name for p in n.all_input_nodes] + extra.get(n.name, [])))
        mat = n.op == "placeholder" or (
            frozen and n.name not in private and all(nodes[p].materializable for p in parents)
        )
        sigs[n.name] = _signature(n, gm, sigs, idx)
        if n.name in extra:
            sigs[n.name] = hashlib.sha1(
                "|".join([sigs[n.name], *(sigs[m] for m in extra[n.name])]).encode()
            ).hexdigest()
        # a leaf function's result may change type with the data (HF masks are None without padding): not stored
        per_record = r2.batch_dim and r3.batch_dim and n.target is not _call_leaf
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
            mutates=tuple(tracked.mutates.get(n.name, ())),
            mutates_views=tuple(tracked.mutates_views.get(n.name, ())),
            inplace_of=tracked.inplace_of.get(n.name),
            aliases=tuple(tracked.aliases.get(n.name, ())),
        )
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    return LayerGraph(gm=gm, nodes=nodes, inputs=tuple(p.name for p in placeholders), output=out_node.args[0].name)
