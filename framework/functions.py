"""The user's functions of a run as one value, and what configs of one pack share.

`UserFunctions` is built and checked once, by `ModelSelection` (or a resume, or a replay), and then passed as
itself: into the run's record (`refs`), to the backends and to every worker, which runs what it holds. `pack_key`
and `signature` say which configs may train as one fused pack (`framework.engine.packs`); `mixes_epochs` whether
configs at different epochs may share one.

No torch at import (the command line reads the names of a run's functions without it); what builds or inspects a
model imports it when called.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: the user functions a run records by name (`meta["functions"]`), in `ModelSelection.resume`'s order
FUNCTIONS = ("model_fn", "train_fn", "eval_fn", "input_fn", "step_fn", "eval_step")


@dataclasses.dataclass(frozen=True)
class UserFunctions:
    """What a run's workers run, from the user: `model_fn(config)` builds a config's model (a `framework.Trainable`
    or what `Trainable.of` takes); training is `train_fn`, or the engine's step loop around `step_fn`; evaluation is
    `eval_fn`, else the loop around `eval_step` or `step_fn`; `input_fn` reads a partition's entries; `extract` (a
    function or a `torch.nn.Module`) makes features near the data, once per partition on its worker.

    Raises `TypeError`, naming the field, for a field that is not callable (`model_fn` is required, the others may
    be None), and for a set that cannot both train and evaluate."""

    model_fn: Callable[..., Any]
    train_fn: Callable[..., Any] | None = None
    eval_fn: Callable[..., Any] | None = None
    input_fn: Callable[..., Any] | None = None
    step_fn: Callable[..., Any] | None = None
    eval_step: Callable[..., Any] | None = None
    extract: Any = None

    def __post_init__(self) -> None:
        if not callable(self.model_fn):
            raise TypeError(f"`model_fn` is {self.model_fn!r}, but must be callable")
        for name in (*FUNCTIONS[1:], "extract"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                like = " (e.g. a torch.nn.Module)" if name == "extract" else ""
                raise TypeError(f"`{name}` is {fn!r}, but must be callable{like} or None")
        if self.train_fn is None and self.step_fn is None:
            raise TypeError("`train_fn` and `step_fn` are both None, but a config trains by one of them: pass "
                            "step_fn=step_fn (step_fn(model, batch, config) -> loss; the engine runs the loop) or a "
                            "train_fn(model, optimizer, data, config) of your own")
        if self.eval_fn is None and self.eval_step is None and self.step_fn is None:
            raise TypeError("`eval_fn` is None, and there is no `eval_step` or `step_fn` to evaluate with: pass "
                            "eval_fn(model, data, config) -> dict")

    def named(self) -> dict[str, Callable[..., Any] | None]:
        """The functions by their names in `FUNCTIONS` (`extract` is not one: a run records it apart)."""
        return {n: getattr(self, n) for n in FUNCTIONS}

    @property
    def train_name(self) -> str:
        """The name of what trains, for messages: "train_fn" or "step_fn"."""
        return "train_fn" if self.train_fn is not None else "step_fn"

    @property
    def eval_name(self) -> str:
        """The name of what evaluates, for messages: "eval_fn", "eval_step" or "step_fn"."""
        return "eval_fn" if self.eval_fn is not None else "eval_step" if self.eval_step is not None else "step_fn"

    def pack_key(self) -> Callable[[Mapping[str, Any]], Hashable | None]:
        """`pack_key(self.model_fn)`: what configs of one pack share."""
        return pack_key(self.model_fn)

    def mixes_epochs(self) -> bool:
        """`mixes_epochs(self.step_fn, self.eval_step)`: whether configs at different epochs may share a pack."""
        return mixes_epochs(self.step_fn, self.eval_step)


def pack_key(model_fn: Callable[..., Any]) -> Callable[[Mapping[str, Any]], Hashable | None]:
    """`key(config)`: what configs of one pack share (`ModelSelection(pack=...)`, the driver's packer): the
    `signature` of what `model_fn` builds, and the batch size. The model is built on PyTorch's meta device (no
    memory, no weights); None, a config that trains alone, where that fails, or it has no optimizer or an enabled
    GradScaler (mixed precision: not stacked; a CUDA scaler built on a driver without CUDA reads as disabled, and
    the worker that finds it enabled trains the pack's members one after another). An LR scheduler packs: each
    member steps its own (`FusedPack.train`)."""
    import torch

    from framework.trainable import Trainable

    def key(config: Mapping[str, Any]) -> Hashable | None:
        try:
            with torch.device("meta"):
                built = Trainable.of(model_fn(dict(config)))
        except Exception:  # e.g. a model_fn that loads weights from a file: the worker builds it for real
            return None
        if built.optimizer is None or (built.grad_scaler is not None and built.grad_scaler.is_enabled()):
            return None
        return signature(built.model, built.optimizer), repr(config.get("batch_size"))

    return key


def mixes_epochs(*fns: Callable[..., Any] | None) -> bool:
    """Whether configs at different epochs may share a pack: none of the step functions `fns` takes `epoch`, which
    one call for the whole pack could not give each member (`framework.scheduling.packing.Packer`'s `mix_epochs`)."""
    from framework.trainable import accepted_kwargs

    return not any(fn is not None and accepted_kwargs(fn, {"epoch": 0}) for fn in fns)


#: optimizer flags configs of one pack must share (`signature`)
OPTIMIZER_FLAGS = ("maximize", "amsgrad", "nesterov", "decoupled_weight_decay")


def signature(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple:
    """What configs must share to train in one pack (hashable): their parameters' and buffers' names, shapes, dtypes
    and devices, the model's repr and its modules' plain attributes (their settings: an activation or dropout rate
    that differs, or `self.act = config["act"]`, makes another architecture), and the optimizer's class and flags.
    Cheap, so the driver groups by it; what it cannot see (a closure, a stored config read in `forward`) the
    member check of every pack's first call finds (`FusedPack.check`)."""
    tensors = tuple((n, tuple(t.shape), t.dtype, str(t.device))
                    for n, t in (*model.named_parameters(), *model.named_buffers()))
    flags = tuple(tuple(bool(g.get(f, False)) for f in OPTIMIZER_FLAGS) for g in optimizer.param_groups)
    return tensors, (repr(model), plain_attributes(model)), type(optimizer), flags


def plain_attributes(model: torch.nn.Module) -> tuple:
    """The plain attributes of `model`'s modules (numbers, strings, None and tuples or lists of them), by module
    path: what a forward may read besides its tensors (`self.act = config["act"]`). Dicts and objects are left out
    (a stored config would keep every config apart); the member check covers what they change."""
    plain = (bool, int, float, str, type(None))
    out = []
    for path, m in model.named_modules():
        for name, v in vars(m).items():
            if name.startswith("_") or name == "training":
                continue
            if isinstance(v, plain) or (isinstance(v, (tuple, list)) and all(isinstance(e, plain) for e in v)):
                out.append((path, name, repr(v)))
    return tuple(out)
