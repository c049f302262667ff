"""The state of a config as it hops: its format (`ModelState`), the one-buffer packing that travels between workers
(`PackedState`), and the self-contained form a checkpoint stores. Plain torch and numpy; no Ray.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

# {"model": state_dict, "optimizer", "lr_scheduler", "grad_scaler": state_dicts or None,
#  "visited": {epoch: [partitions absorbed, in order]}},
# tensors on CPU; loadable with torch.load(weights_only=True).
ModelState = dict[str, Any]


def to_cpu(obj: Any) -> Any:
    """Tensors in `obj` on the host (a host tensor is shared, not copied: the model it came from is dropped after
    its unit)."""
    return map_leaves(obj, lambda t: t.detach().to("cpu") if isinstance(t, torch.Tensor) else t)



@dataclass(frozen=True)
class _Slot:
    """Where one tensor of a packed state lives in its buffer."""

    offset: int
    nbytes: int
    dtype: str  # e.g. "float32" (an attribute of torch)
    shape: tuple[int, ...]


_ALIGN = 64


@dataclass
class PackedState:
    """A config state with every dense tensor copied into one contiguous byte buffer: what travels between workers.

    Ray moves a numpy buffer through its shared-memory object store without pickling it (one copy in, none out),
    where a dict of torch tensors is pickled tensor by tensor; the receiver takes the whole state back with one copy
    (`unpack_state`). `tree` is the state with each tensor replaced by its `_Slot`.
    """

    buffer: np.ndarray  # uint8 (each tensor starts at a multiple of 64 bytes)
    tree: Any
    nbytes: int = 0  # bytes of tensor payload (the buffer without its alignment padding)


def map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """`obj` with `fn` applied to every leaf under its dicts, lists and tuples. A plain function, not a recursive
    closure: that would be a reference cycle, keeping every tensor it saw alive until the cyclic collector runs."""
    if isinstance(obj, dict):
        return {k: map_leaves(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [map_leaves(v, fn) for v in obj]
    if isinstance(obj, tuple):
        return tuple(map_leaves(v, fn) for v in obj)
    return fn(obj)


def _unpack_tree(obj: Any, flat: torch.Tensor, copy: bool) -> Any:
    def leaf(slot: Any) -> Any:
        if not isinstance(slot, _Slot):
            return slot
        dtype = getattr(torch, slot.dtype)
        if slot.nbytes == 0:
            return torch.empty(slot.shape, dtype=dtype, device=flat.device)
        view = flat[slot.offset : slot.offset + slot.nbytes].view(dtype).view(slot.shape)
        return view.clone() if copy else view

    return map_leaves(obj, leaf)


def pack_state(state: ModelState | None) -> PackedState | None:
    """`state` with its dense tensors in one buffer (on the host: a GPU tensor is copied down once)."""
    if state is None:
        return None
    tensors: list[torch.Tensor] = []
    end = 0

    def leaf(obj: Any) -> Any:  # a dense tensor becomes its slot in the buffer
        nonlocal end
        if not (isinstance(obj, torch.Tensor) and obj.layout == torch.strided and not obj.is_quantized):
            return obj
        slot = _Slot(end, obj.numel() * obj.element_size(), str(obj.dtype).removeprefix("torch."), tuple(obj.shape))
        tensors.append(obj)
        end += -(-slot.nbytes // _ALIGN) * _ALIGN
        return slot

    tree = map_leaves(state, leaf)
    buffer = np.empty(end, dtype=np.uint8)
    flat = torch.from_numpy(buffer)
    offset = payload = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        if n:
            flat[offset : offset + n].view(t.dtype).view(t.shape).copy_(t.detach())
        padded = -(-n // _ALIGN) * _ALIGN
        buffer[offset + n : offset + padded] = 0  # no stray memory travels: equal states pack to equal bytes
        offset += padded
        payload += n
    return PackedState(buffer, tree, payload)


def unpack_state(
    state: PackedState | ModelState | None, device: torch.device | str | None = None, copy_model: bool = True
) -> ModelState | None:
    """The plain state behind a `PackedState` (a plain state or None passes through). Every tensor is a writable
    copy of its own (so the model's weights can be dropped once loaded while the optimizer keeps its moments), on
    `device` when given (one copy of the whole buffer from pinned memory to the GPU, asynchronous on the current
    stream, then one per tensor there). `copy_model=False`: the tensors under `"model"` are views of the buffer
    instead, read-only when the buffer is (enough for `load_state_dict`, which copies them into the model)."""
    if not isinstance(state, PackedState):
        return state
    with warnings.catch_warnings():  # a buffer read from Ray's object store is read-only: it is only read here
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(state.buffer) if state.buffer.size else torch.empty(0, dtype=torch.uint8)
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)
    tree = state.tree
    if copy_model or not isinstance(tree, dict):
        return _unpack_tree(tree, flat, True)
    return {k: _unpack_tree(v, flat, k != "model") for k, v in tree.items()}


def state_nbytes(state: ModelState | None) -> int:
    """Bytes of tensor payload in a model state (what a hop moves)."""
    if state is None:
        return 0
    if isinstance(state, PackedState):
        return state.nbytes
    total = 0
    stack: list[Any] = [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total



def self_contained(state: ModelState | None, resolve: Callable[[Any], dict] = lambda handle: handle) -> ModelState | None:
    """`state` with frozen weights shared between workers (`state["frozen"]`) fetched back into its model: what a
    checkpoint stores. `resolve` turns the shared handle into the weights."""
    if state is None or "frozen" not in state:
        return state
    frozen = resolve(state["frozen"]["weights"])
    return {**{k: v for k, v in state.items() if k != "frozen"}, "model": {**state["model"], **frozen}}

