"""`Trainable`: everything whose state hops with a config: the model, its optimizer, an LR scheduler, a GradScaler.

`model_fn(config)` returns either `(model, optimizer)` or a `Trainable`. The engine moves the state of every part
from worker to worker, checkpoints it and replays it, so an epoch-wise learning-rate schedule or fp16 mixed precision
behaves on MOP as it does in one process.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

INTERVALS = ("epoch", "step")


@dataclass
class Trainable:
    """A model and the objects that train it.

    Args:
        model: the `torch.nn.Module`.
        optimizer: a `torch.optim.Optimizer` or None (a model that does not train, e.g. an eval-only baseline).
        lr_scheduler: a `torch.optim.lr_scheduler.LRScheduler` on `optimizer`, or None.
        grad_scaler: a `torch.amp.GradScaler`, or None; `train_fn` uses it (it receives it as `grad_scaler=`).
        scheduler_interval: `"epoch"`: the engine steps `lr_scheduler` once per epoch of the config, before its first
            training unit of epochs 1, 2, ... (on whichever worker that unit runs), so `T_max=epochs` schedules
            work as written; `"step"`: `train_fn` steps it (it receives it as `lr_scheduler=`).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    lr_scheduler: Any = None
    grad_scaler: Any = None
    scheduler_interval: str = "epoch"

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise TypeError(f"`model` is a {type(self.model).__name__}, but must be a torch.nn.Module")
        if self.optimizer is not None and not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"`optimizer` is a {type(self.optimizer).__name__}, but must be a torch.optim.Optimizer")
        if self.lr_scheduler is not None and self.optimizer is None:
            raise ValueError("`lr_scheduler` is set, but `optimizer` is None: a scheduler needs the optimizer it drives")
        for name in ("lr_scheduler", "grad_scaler"):
            part = getattr(self, name)
            if part is not None and not (hasattr(part, "state_dict") and hasattr(part, "load_state_dict")):
                raise TypeError(f"`{name}` is a {type(part).__name__}, which has no state_dict/load_state_dict")
        if self.scheduler_interval not in INTERVALS:
            raise ValueError(f"`scheduler_interval` is {self.scheduler_interval!r}, but must be one of {list(INTERVALS)}")

    @classmethod
    def of(cls, built: Any) -> Trainable:
        """What `model_fn` returned, as a `Trainable` (`(model, optimizer)` tuples included)."""
        if isinstance(built, Trainable):
            return built
        if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module):
            return cls(built[0], built[1])
        raise TypeError(
            f"model_fn must return (torch.nn.Module, optimizer or None) or a framework.Trainable, got {type(built).__name__}"
        )

    def state_dict(self) -> dict[str, Any]:
        """The parts' states besides the model's (which travels on its own): optimizer, lr_scheduler, grad_scaler."""
        return {
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "grad_scaler": self.grad_scaler.state_dict() if self.grad_scaler is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any], fresh_hyperparameters: bool = False) -> None:
        """Load what `state_dict` saved. `fresh_hyperparameters`: keep this optimizer's own hyper-parameters (a PBT
        clone inherits its donor's moments but trains with its own, perturbed config)."""
        if self.optimizer is not None and state.get("optimizer") is not None:
            fresh = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
            self.optimizer.load_state_dict(state["optimizer"])
            if fresh_hyperparameters:
                for group, own in zip(self.optimizer.param_groups, fresh):
                    group.update(own)
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if self.grad_scaler is not None and state.get("grad_scaler"):  # a disabled scaler saves {}
            self.grad_scaler.load_state_dict(state["grad_scaler"])


def function_ref(fn: Callable | None) -> str | None:
    """How the run log names a user function for replay: `module:qualname`."""
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"


def import_ref(ref: str | None, name: str, where: str = "replay()") -> Callable | None:
    """The function a run log names (`function_ref`), imported again; None for None. Only call it for a run whose
    catalog verifies: importing runs the module's code."""
    if ref is None:
        return None
    module, _, qualname = ref.partition(":")
    if module == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(f"`{name}` was {ref!r} in the run, which cannot be imported again; pass `{name}=` to {where}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def accepted_kwargs(fn: Callable, offered: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments in `offered` that `fn` declares (all of them if it takes `**kwargs`)."""
    try:
        names = _declared(fn)
    except TypeError:  # an unhashable callable: read its signature every time
        names = _declared.__wrapped__(fn)
    return dict(offered) if names is None else {k: v for k, v in offered.items() if k in names}


@functools.lru_cache(maxsize=64)
def _declared(fn: Callable) -> frozenset[str] | None:
    """`fn`'s parameter names (None: it takes `**kwargs`), read once per function, not once per unit."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: offer nothing
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params)
