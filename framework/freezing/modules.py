"""Splitting a model into an ordered list of *layer modules*, the unit Egeria freezes (Egeria section 4.2.1).

A layer module is a run of consecutive sub-modules ("members") named by their qualified names in the model
(`"stage1"`, `"stage3.0"`). Its output activation is the output of its last member; its parameters are the members'
parameters. Three ways to split:

- `split_children`: one layer module per top-level child that holds parameters (parameter-free children such as a
  ReLU or a pooling layer join the module before them).
- `split_regex`: one layer module per module whose qualified name fully matches a user regex (descendants of a match
  are not matched again); parameters outside every match are never frozen.
- `split_by_size`: modules of similar parameter counts, as Egeria does for ResNet stages: ``nn.Sequential`` children
  larger than the per-module share are expanded into their own children, then consecutive pieces are grouped so the
  largest group is as small as possible.

Activation caching runs the model from the output of the last frozen member, cutting it at a module boundary with
forward hooks (`framework.freezing.cut`): any model works (a torchvision ResNet split at its top-level children or
residual blocks, a HuggingFace BERT split with ``split_regex(model, r"bert\.embeddings|bert\.encoder\.layer\.\d+|head")``)
as long as nothing after the cut reads values from inside the prefix. `is_sequential_chain` tells the simple case
where the members compose to the model's forward by construction.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class LayerModule:
    """A run of consecutive sub-modules frozen together.

    Args:
        name: display name, e.g. ``"stem+stage1"``.
        members: qualified module names (as in ``model.named_modules()``), in forward order.
    """

    name: str
    members: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError(f"`members` of layer module {self.name!r} is empty, but must name at least one module")

    def parameter_names(self, model: nn.Module) -> list[str]:
        """Qualified names of every parameter of the members, as in ``model.named_parameters()``."""
        return [f"{m}.{p}" if m else p for m in self.members for p, _ in model.get_submodule(m).named_parameters()]

    def state_keys(self, model: nn.Module) -> list[str]:
        """Keys of ``model.state_dict()`` owned by the members (parameters and buffers)."""
        keys = []
        for m in self.members:
            keys.extend(f"{m}.{k}" if m else k for k in model.get_submodule(m).state_dict())
        return keys


def _num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _attach_parameter_free(pieces: list[tuple[str, nn.Module]]) -> list[list[str]]:
    """Group pieces so each group holds parameters; a parameter-free piece joins the group before it."""
    groups: list[list[str]] = []
    pending: list[str] = []  # parameter-free pieces before the first group with parameters
    for name, module in pieces:
        if _num_params(module) == 0 and groups:
            groups[-1].append(name)
        elif _num_params(module) == 0:
            pending.append(name)
        else:
            groups.append([*pending, name])
            pending = []
    if pending and groups:
        groups[-1].extend(pending)
    return groups


def split_children(model: nn.Module) -> list[LayerModule]:
    """One layer module per top-level child with parameters, in registration order."""
    groups = _attach_parameter_free(list(model.named_children()))
    if not groups:
        raise ValueError(f"`model` ({type(model).__name__}) has no child module with parameters, but needs one")
    return [LayerModule(name=g[0] if len(g) == 1 else "+".join(g), members=tuple(g)) for g in groups]


def split_regex(model: nn.Module, pattern: str) -> list[LayerModule]:
    """One layer module per module whose qualified name fully matches `pattern`, in registration order."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"`pattern` is {pattern!r}, but must be a valid regular expression ({exc})") from None
    matched: list[str] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(m + ".") for m in matched):
            continue
        if regex.fullmatch(name) and _num_params(module) > 0:
            matched.append(name)
    if not matched:
        raise ValueError(f"`pattern` is {pattern!r}, but must fully match at least one module name with parameters")
    return [LayerModule(name=m, members=(m,)) for m in matched]


def _linear_partition(sizes: Sequence[int], k: int) -> list[int]:
    """Split `sizes` into at most `k` consecutive groups minimising the largest group sum; returns group lengths."""
    n = len(sizes)
    k = min(k, n)
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    inf = float("inf")
    # best[j][i]: smallest max-group-sum splitting the first i pieces into j groups
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for t in range(j - 1, i):
                cost = max(best[j - 1][t], prefix[i] - prefix[t])
                if cost < best[j][i]:
                    best[j][i], cut[j][i] = cost, t
    lengths, i = [], n
    for j in range(k, 0, -1):
        lengths.append(i - cut[j][i])
        i = cut[j][i]
    return lengths[::-1]


def split_by_size(model: nn.Module, num_modules: int) -> list[LayerModule]:
    """About `num_modules` layer modules of similar parameter counts (Egeria's ResNet-56 split, section 6.3).

    ``nn.Sequential`` children larger than ``total / num_modules`` are expanded into their own children (recursively;
    other modules, e.g. a residual block, are atoms since their forward is not a plain chain), then consecutive pieces
    are grouped by a linear partition that minimises the largest group.
    """
    if isinstance(num_modules, bool) or not isinstance(num_modules, int):
        raise TypeError(f"`num_modules` is {num_modules!r}, but must be an int")
    if num_modules < 1:
        raise ValueError(f"`num_modules` is {num_modules}, but must be >= 1")
    total = _num_params(model)
    if total == 0:
        raise ValueError(f"`model` ({type(model).__name__}) has no parameters, but needs some to split by size")
    share = total / num_modules
    pieces: list[tuple[str, nn.Module]] = []

    def expand(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            qualified = f"{prefix}.{name}" if prefix else name
            if _num_params(child) > share and isinstance(child, nn.Sequential) and len(child) > 0:
                expand(qualified, child)
            else:
                pieces.append((qualified, child))

    expand("", model)
    groups = _attach_parameter_free(pieces)
    sizes = [sum(_num_params(model.get_submodule(m)) for m in g) for g in groups]
    out, start = [], 0
    for length in _linear_partition(sizes, num_modules):
        members = tuple(m for g in groups[start : start + length] for m in g)
        start += length
        names = [g[0] for g in groups[start - length : start]]
        out.append(LayerModule(name=names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}", members=members))
    return out


def is_sequential_chain(model: nn.Module, modules: Sequence[LayerModule]) -> bool:
    """True when running the members of `modules` in order reproduces ``model(x)`` exactly.

    That holds when the members cover the model's top level without gaps or overlaps and every module between the
    root and a member is an ``nn.Sequential`` (whose forward is exactly "call the children in order").
    """
    members = [m for lm in modules for m in lm.members]
    expected: list[str] = []

    def walk(prefix: str, module: nn.Module) -> bool:
        for name, child in module.named_children():
            qualified = f"{prefix}.{name}" if prefix else name
            if qualified in members:
                expected.append(qualified)
            elif any(m.startswith(qualified + ".") for m in members):
                if not isinstance(child, nn.Sequential) or not walk(qualified, child):
                    return False
            else:
                return False
        return True

    return isinstance(model, nn.Sequential) and walk("", model) and expected == members
