"""Cutting a model at a module boundary: run it from a cached activation of its frozen prefix (Egeria section 4.3).

The model is any ``nn.Module`` (a torchvision ResNet, a HuggingFace BERT inside a classifier, an ``nn.Sequential``);
its forward is not rewritten. `PrefixCut` knows the ordered *members* of the layer modules (qualified module
names) and a prefix length k. To run the model from a cached output of member ``k - 1`` (the *boundary*), it
temporarily replaces the forward of every prefix member for one call of the model:

- the boundary returns the cached activation (as a tensor, or a tuple/list whose first item is it, the way the
  member returned it);
- the other prefix members return zeros of their recorded output shape without computing anything (their outputs
  only feed later prefix members, which are replaced too);
- everything else, including code in the parents' ``forward`` and modules that are not members, runs as usual.

That gives ``model(x)`` exactly when the boundary is a *cut* of the model's data flow. The rules, checked on the
first batch of every new prefix (`verify`):

1. every member runs exactly once per forward pass, in the listed order (so "the prefix" is well defined);
2. a member's output is a tensor, or a tuple/list whose first item is a tensor and whose other items are None;
3. nothing after the boundary reads a value computed inside the prefix other than the boundary's output (a residual
   connection around the boundary breaks this): checked by comparing the cut forward pass with the full one in
   eval mode.

A ResNet cut between its top-level children (``conv1 .. layer4``) or between residual blocks (``layer2.0``), and a
BERT cut after ``embeddings`` or any ``encoder.layer.<i>``, satisfy them; a cut inside a residual block does not.
Violations raise `CutError` naming the model, the member and the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn


class CutError(ValueError):
    """A model cannot be run from a cached activation at the requested module boundary."""


@dataclass(frozen=True)
class _Template:
    """What a member returned, so it can be imitated without running: container kind, length, row shape, dtype."""

    kind: str  # "tensor" | "tuple" | "list"
    length: int
    row_shape: tuple[int, ...]
    dtype: torch.dtype


def _primary(model_name: str, member: str, output: object) -> tuple[torch.Tensor, _Template]:
    if isinstance(output, torch.Tensor):
        return output, _Template("tensor", 1, tuple(output.shape[1:]), output.dtype)
    if (
        isinstance(output, (tuple, list))
        and output
        and isinstance(output[0], torch.Tensor)
        and all(o is None for o in output[1:])
    ):
        kind = "tuple" if isinstance(output, tuple) else "list"
        return output[0], _Template(kind, len(output), tuple(output[0].shape[1:]), output[0].dtype)
    raise CutError(
        f"member {member!r} of {model_name} returned {type(output).__name__}, but a member must return a tensor, "
        "or a tuple/list whose first item is a tensor and whose other items are None (rule 2 of a cut)"
    )


def _wrap(template: _Template, tensor: torch.Tensor) -> object:
    if template.kind == "tensor":
        return tensor
    items = [tensor, *([None] * (template.length - 1))]
    return tuple(items) if template.kind == "tuple" else items


def check_members(model: nn.Module, members: Sequence[str]) -> None:
    """Static rules (no forward pass needed): members exist, are distinct, and none contains another."""
    name = type(model).__name__
    known = dict(model.named_modules())
    seen: set[str] = set()
    for m in members:
        if m not in known or m == "":
            raise CutError(f"member {m!r} is not a sub-module of {name}, but every member must be one")
        if m in seen:
            raise CutError(f"member {m!r} of {name} is listed twice, but each member may appear once")
        seen.add(m)
    for a in members:
        for b in members:
            if b.startswith(a + "."):
                raise CutError(f"member {b!r} of {name} lies inside member {a!r}, but members must not nest")


class PrefixCut:
    """Runs `model` fully or from a cached boundary activation (see the module docstring).

    Args:
        model: the model; its forward is called as ``model(inputs)``.
        members: qualified names of the layer modules' members, in forward order.

    Not thread-safe: a cut forward pass patches the prefix members' ``forward`` for its duration.
    """

    def __init__(self, model: nn.Module, members: Sequence[str]) -> None:
        check_members(model, members)
        self.model = model
        self.members = list(members)
        self._modules = [model.get_submodule(m) for m in self.members]
        self._templates: dict[str, _Template] = {}

    @property
    def model_name(self) -> str:
        return type(self.model).__name__

    def boundary(self, k: int) -> str:
        """The member whose output is cached when the first `k` members are frozen."""
        assert 1 <= k <= len(self.members), k
        return self.members[k - 1]

    def forward_capture(
        self, inputs: torch.Tensor, k: int, on_boundary: Callable[[torch.Tensor], None] | None = None
    ) -> torch.Tensor:
        """``model(inputs)``, calling `on_boundary` with the boundary member's output the moment it exists.

        Also records the output templates of the first `k` members (needed to run from a cached activation).
        """
        handles = []

        def record(member: str, is_boundary: bool) -> Callable:
            def hook(_module: nn.Module, _inputs: object, output: object) -> None:
                tensor, self._templates[member] = _primary(self.model_name, member, output)
                if is_boundary and on_boundary is not None:
                    on_boundary(tensor.detach())

            return hook

        for i, (m, module) in enumerate(zip(self.members[:k], self._modules[:k], strict=True)):
            handles.append(module.register_forward_hook(record(m, i == k - 1)))
        try:
            return self.model(inputs)
        finally:
            for h in handles:
                h.remove()

    def forward_cached(self, inputs: torch.Tensor, k: int, cached: torch.Tensor) -> torch.Tensor:
        """``model(inputs)`` with the first `k` members replaced by `cached` (the boundary's output for `inputs`)."""
        missing = [m for m in self.members[:k] if m not in self._templates]
        if missing:
            raise RuntimeError(f"members {missing} have no recorded output yet: call forward_capture or verify first")
        rows = cached.shape[0]
        patched: list[tuple[nn.Module, object]] = []

        def replay(member: str, is_boundary: bool) -> Callable:
            template = self._templates[member]

            def forward(*_args: object, **_kwargs: object) -> object:
                if is_boundary:
                    return _wrap(template, cached)
                return _wrap(
                    template, torch.zeros((rows, *template.row_shape), dtype=template.dtype, device=cached.device)
                )

            return forward

        try:
            for i, (m, module) in enumerate(zip(self.members[:k], self._modules[:k], strict=True)):
                patched.append((module, module.__dict__.get("forward")))
                module.forward = replay(m, i == k - 1)  # an instance attribute shadows the class's forward
            return self.model(inputs)
        finally:
            for module, previous in patched:
                if previous is None:
                    del module.forward
                else:
                    module.forward = previous

    @torch.no_grad()
    def verify(self, inputs: torch.Tensor, k: int) -> torch.Tensor:
        """Check the three rules for a cut after member ``k - 1`` on `inputs`; returns the boundary activation.

        Runs the model twice in eval mode (the modules' train/eval flags are restored afterwards) and raises
        `CutError` naming the model, the member and the rule that fails.
        """
        order: list[str] = []
        handles = [
            module.register_forward_pre_hook(lambda _m, _i, name=m: order.append(name))
            for m, module in zip(self.members, self._modules, strict=True)
        ]
        flags = {module: module.training for module in self.model.modules()}
        self.model.eval()
        try:
            captured: list[torch.Tensor] = []
            full = self.forward_capture(inputs, k, lambda a: captured.append(a.clone()))
            for h in handles:
                h.remove()
            handles = []
            wrong = [m for m in self.members if order.count(m) != 1]
            if wrong or order != self.members:
                raise CutError(
                    f"{self.model_name}'s forward ran the members in the order {order}, but every member must run "
                    f"exactly once, in the listed order {self.members} (rule 1 of a cut)"
                )
            boundary = captured[0]
            try:
                cut = self.forward_cached(inputs, k, boundary.clone())
            except Exception as exc:  # e.g. code between members that needs the real values of earlier members
                raise CutError(
                    f"{self.model_name} run from the cached output of member {self.boundary(k)!r} failed "
                    f"({type(exc).__name__}: {exc}), but a model must run from a cut's output alone (rule 3 of a cut)"
                ) from exc
            same = _same_output(full, cut)
        finally:
            for h in handles:
                h.remove()
            for module, flag in flags.items():
                module.training = flag
        if not same:
            raise CutError(
                f"{self.model_name} run from the cached output of member {self.boundary(k)!r} differs from the full "
                "forward pass, but nothing after a cut may read a value computed before it except the boundary's "
                "output (rule 3 of a cut; e.g. a residual connection around the boundary): cut at another member"
            )
        return boundary


def _same_output(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_output(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_output(a[k], b[k]) for k in a)
    return a == b
