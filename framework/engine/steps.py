"""The step-level contract: the engine owns the training loop, the user writes one step.

    def step_fn(model, batch, config):                  # batch: rows of the partition, on the model's device
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits, y), {"accuracy": (logits.argmax(1) == y).float().mean()}

    ModelSelection(model_fn, step_fn=step_fn, dataset=dataset, procedure=search)

`step_fn(model, batch, config)` returns the batch's mean loss (a scalar tensor with a graph), `(loss, metrics)`, or
a dict that holds `"loss"`; metrics are numbers or one-element tensors, means over the batch. It may declare `epoch`
(the config's, from 0) and `freezing` (the `FreezingController` under layer freezing; None without it, and in
evaluation) as keywords. For each training unit the engine (`StepLoop.train`):

* shuffles the partition's rows (a gang member: its share) with the unit's seed and cuts them into batches of
  `config["batch_size"]`; a gang of k members takes `batch_size // k` rows each per step, so a step's global batch is
  the config's; the last batch of a pass may be smaller;
* moves each batch to the model's device (nothing moves when the partition lives there already);
* zeroes the gradients, calls `step_fn`, runs backward and steps the optimizer; with an enabled `GradScaler`
  (`framework.Trainable`), under autocast (float16 on CUDA, bfloat16 on CPU) with the loss scaled; steps the LR
  scheduler after every optimizer step when its `scheduler_interval` is `"step"` (an `"epoch"` schedule the worker
  steps once per epoch, as for any `train_fn`);
* in a gang, takes part in the gradient average of every step (the gang wraps `optimizer.step`), with no `gang_size`
  in user code;
* with layer freezing, calls the model through the `FreezingController`: `model(x)` inside `step_fn` is
  `controller.forward(x, row_ids)` (its activation cache is keyed by the partition's row ids), every step's loss and
  learning rate reach it, and it is told the pass's row order so its cache prefetches;
* reports `loss` (the example-weighted mean over the pass), the means of the step's metrics, and `num_examples`:
  exactly the rows it trained on.

Evaluation (`StepLoop.evaluate`, under `torch.no_grad()` and `model.eval()`): `eval_step(model, batch, config)`
returns a dict of batch means (or what `step_fn` may return), averaged over the partition in order, in batches of
`config["eval_batch_size"]` (default: `batch_size`); without an `eval_step`, `step_fn` itself gives the loss and
metrics.

Why this shape. Lightning asks for `training_step(batch, batch_idx)` returning a loss or a dict with "loss";
Determined for `train_batch(batch, epoch_idx, batch_idx)` returning a dict with "loss"; Composer for the model's
`forward(batch)` and `loss(outputs, batch)`. All three leave the forward pass and the loss to the user and own the
rest. A free function rather than a method of a model class keeps `model_fn` as it is (any `nn.Module`: a torchvision
or Hugging Face model unchanged), and `config` is its third argument because one step serves every config of a
search. Its return forms are Lightning's and Determined's, so an existing step moves over as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from framework.data import data_len
from framework.engine.state import map_leaves
from framework.trainable import accepted_kwargs

__all__ = ["StepLoop", "batch_size_of", "device_of", "take", "to_device"]

_RETURNS = "a loss tensor, (loss, metrics) or a dict holding 'loss'"


def batch_size_of(config: Mapping[str, Any], key: str = "batch_size", default: int | None = None) -> int:
    """`config[key]` as a positive int (`default` when the config has no such key)."""
    value = config.get(key, default) if isinstance(config, Mapping) else default
    if value is None:
        raise ValueError(f"the config has no {key!r}, but the step-level contract (`step_fn`) batches the partition "
                         f"by `config[{key!r}]`: add it to the search space (config: {dict(config)!r})")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`config[{key!r}]` is {value!r}, but must be an int >= 1 (rows per batch)")
    return int(value)


def take(data: Any, index: torch.Tensor | slice) -> Any:
    """The rows `index` (a tensor of row ids, or a slice) of a partition's data: a tensor or array (rows), a tuple or
    dict of them (fields, e.g. `(x, y)` or `extract`'s features), or a list of examples."""
    if isinstance(data, torch.Tensor):
        if isinstance(index, slice):
            return data[index]
        return data.index_select(0, index if index.device == data.device else index.to(data.device))
    if isinstance(data, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(data[index if isinstance(index, slice) else index.numpy()]))
    if isinstance(data, tuple):
        return tuple(take(d, index) for d in data)
    if isinstance(data, dict):
        return {k: take(v, index) for k, v in data.items()}
    if isinstance(data, list):
        return data[index] if isinstance(index, slice) else [data[i] for i in index.tolist()]
    raise TypeError(f"the step-level contract cannot batch a partition of type {type(data).__name__}: input_fn must "
                    "return a tensor or array, a tuple or dict of them, or a list of examples")


def to_device(batch: Any, device: torch.device) -> Any:
    """`batch` with its tensors on `device` (those already there stay; tuples, lists and dicts are walked)."""
    return map_leaves(batch, lambda t: t.to(device, non_blocking=True)
                      if isinstance(t, torch.Tensor) and t.device != device else t)


def model_device(model: torch.nn.Module) -> torch.device:
    """Where `model`'s parameters live (the host for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def device_of(data: Any) -> torch.device:
    """Where the first tensor of a partition's data lives (the host when it holds none)."""
    if isinstance(data, torch.Tensor):
        return data.device
    for part in data.values() if isinstance(data, dict) else data if isinstance(data, (tuple, list)) else ():
        if isinstance(part, (torch.Tensor, tuple, dict)):
            return device_of(part)
    return torch.device("cpu")


def split_output(out: Any, fn_name: str, need_loss: bool = True) -> tuple[torch.Tensor | None, Mapping[str, Any]]:
    """(loss, metrics) of what a step function returned (see the module docstring)."""
    if isinstance(out, torch.Tensor):
        loss, metrics = out, {}
    elif isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
        loss, metrics = out
    elif isinstance(out, Mapping):
        loss, metrics = out.get("loss"), {k: v for k, v in out.items() if k != "loss"}
    else:
        raise TypeError(f"{fn_name} must return {_RETURNS}, got {type(out).__name__}")
    if loss is None and not need_loss:
        return None, metrics
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise TypeError(f"{fn_name} must return {_RETURNS} whose loss is a one-element tensor (the batch's mean), "
                        f"got {what}")
    return loss, metrics


def check_metric(fn_name: str, key: str, value: Any) -> Any:
    """`value` if it is a metric: one number (a Python or NumPy number, or a one-element tensor), else `TypeError`
    naming `fn_name` and `key`."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"{fn_name} returned metric {key!r} as a tensor of shape {tuple(value.shape)}, but a "
                            "metric must be one number (the batch's mean)")
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{fn_name} returned metric {key!r} = {value!r}, which is not a number")
    return value


class Means:
    """The example-weighted means of a pass's per-step losses and metrics, for `k` models at once: one (a unit
    alone, `add`) or the `k` members of a fused pack (`add_members`); the one averaging of both training loops and
    both evaluations. A value on the host is read at once (`.item()` costs less than tensor arithmetic); a value on
    a device, and a pack's per-member values, are kept where they were computed and reduced once per pass, so a
    step neither waits for the device nor launches work of its own for the bookkeeping. Sums are float64; each mean
    is its sum over the pass's examples (`means(n)`)."""

    def __init__(self, fn_name: str, k: int = 1) -> None:
        self.fn_name, self.k = fn_name, k
        self.sums: list[dict[str, float]] = [{} for _ in range(k)]  # per model: key -> sum of value * rows (host)
        self.kept: list[tuple[tuple[str, ...], torch.Tensor, int]] = []  # (keys, values (k, len(keys)), rows)

    def add(self, values: Mapping[str, Any], rows: int) -> None:
        """One step of one model (k = 1) over `rows` examples: its loss and metrics by name (each checked:
        `check_metric`)."""
        for key, v in values.items():
            v = check_metric(self.fn_name, key, v)
            if isinstance(v, torch.Tensor):
                if v.device.type != "cpu":
                    self.kept.append(((key,), v.detach().reshape(1, 1), rows))
                    continue
                v = v.item()
            self.sums[0][key] = self.sums[0].get(key, 0.0) + v * rows

    def add_members(self, keys: tuple[str, ...], values: torch.Tensor, rows: int) -> None:
        """One step of every member over `rows` examples each: `values` (k, len(keys)), member i's in row i."""
        self.kept.append((keys, values.detach(), rows))

    def means(self, n: int) -> list[dict[str, float]]:
        """Per model: each key's sum over the pass's `n` examples, and `num_examples` (n)."""
        out = [dict(s) for s in self.sums]
        for keys in dict.fromkeys(keys for keys, _, _ in self.kept):  # (the same keys every step, as a rule)
            steps = [(values, rows) for ks, values, rows in self.kept if ks == keys]
            stacked = torch.stack([values for values, _ in steps]).double()  # (steps, k, len(keys))
            weights = torch.tensor([rows for _, rows in steps], dtype=torch.float64, device=stacked.device)
            for i, sums in enumerate((stacked * weights.view(-1, 1, 1)).sum(0).tolist()):
                for key, total in zip(keys, sums, strict=True):
                    out[i][key] = out[i].get(key, 0.0) + total
        return [{**{key: float(total) / max(n, 1) for key, total in o.items()}, "num_examples": n} for o in out]


class _ThroughController:
    """The model as `step_fn` sees it under layer freezing: calling it with one input runs the controller's forward
    on the batch's row ids (`ids`); every attribute is the model's."""

    def __init__(self, controller: Any, model: torch.nn.Module) -> None:
        self._controller, self._model, self.ids = controller, model, None

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return self._model(x, *args, **kwargs)
        return self._controller.forward(x, self.ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class StepLoop:
    """The engine's `train_fn` and `eval_fn` around a user's `step_fn` (and `eval_step`); see the module docstring."""

    def __init__(self, step_fn: Callable, eval_step: Callable | None = None) -> None:
        self.step_fn, self.eval_step = step_fn, eval_step

    def train(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, data: Any, config: Mapping[str, Any],
        *, epoch: int = 0, lr_scheduler: Any = None, grad_scaler: Any = None, gang_size: int = 1,
        scheduler_interval: str = "epoch", freezing: Any = None,
    ) -> dict[str, float]:
        """One shuffled pass of `step_fn` over `data` (a partition, or a gang member's share of one)."""
        if optimizer is None:
            raise TypeError("model_fn returned no optimizer, but `step_fn` trains: return (model, optimizer) or a "
                            "framework.Trainable with one")
        n, batch = data_len(data), batch_size_of(config)
        local = max(1, batch // gang_size)
        if local > n:
            share = f" (its share in a gang of {gang_size}: {local})" if gang_size > 1 else ""
            raise ValueError(f"`config['batch_size']` is {batch}{share}, but the partition this unit trains holds "
                             f"{n} rows: lower the batch size or use fewer, larger partitions")
        device = model_device(model)
        held = device_of(data)
        order = torch.randperm(n).to(held)  # the unit's seed drew it (the worker seeded it)
        chunks = order.split(local)
        move = held != device  # (decided once per pass: a step on data that lives with the model moves nothing)
        net: Any = model
        if freezing is not None:
            net = _ThroughController(freezing, model)
            freezing.set_upcoming([c.cpu() for c in chunks])
        amp = grad_scaler is not None and grad_scaler.is_enabled()
        autocast = (lambda: torch.autocast(device.type, dtype=torch.float16 if device.type == "cuda"
                                           else torch.bfloat16)) if amp else contextlib.nullcontext
        per_step = lr_scheduler is not None and scheduler_interval == "step"
        extras = accepted_kwargs(self.step_fn, {"epoch": epoch, "freezing": freezing})
        means = Means("step_fn")
        for ids in chunks:
            rows = to_device(take(data, ids), device) if move else take(data, ids)
            if freezing is not None:
                net.ids = ids.cpu()
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss, metrics = split_output(self.step_fn(net, rows, config, **extras), "step_fn")
            if not loss.requires_grad:
                raise ValueError("step_fn returned a loss that has no graph to train through (computed under "
                                 "torch.no_grad(), detached, or from a .item()): return the loss tensor itself")
            if loss.dim():
                loss = loss.reshape(())
            if amp:
                grad_scaler.scale(loss).backward()
                grad_scaler.step(optimizer)
                grad_scaler.update()
            else:
                loss.backward()
                optimizer.step()
            if per_step:
                lr_scheduler.step()
            if freezing is not None:
                freezing.after_step(loss.detach(), optimizer.param_groups[0]["lr"])
            means.add({"loss": loss, **metrics}, len(ids))
        return means.means(n)[0]

    def evaluate(self, model: torch.nn.Module, data: Any, config: Mapping[str, Any], *, epoch: int = 0
                 ) -> dict[str, float]:
        """The partition's loss and metrics from `eval_step` (or `step_fn`), batch by batch, in order."""
        fn, name = (self.eval_step, "eval_step") if self.eval_step is not None else (self.step_fn, "step_fn")
        n = data_len(data)
        batch = batch_size_of(config, "eval_batch_size", batch_size_of(config))
        device = model_device(model)
        extras = accepted_kwargs(fn, {"epoch": epoch, "freezing": None})  # (no layer freezing without training)
        means = Means(name)
        for start in range(0, n, batch):
            rows = to_device(take(data, slice(start, min(start + batch, n))), device)
            loss, metrics = split_output(fn(model, rows, config, **extras), name, need_loss=self.eval_step is None)
            means.add(metrics if loss is None else {"loss": loss, **metrics}, min(batch, n - start))
        return means.means(n)[0]
