"""Ready-made user functions (an MLP classifier on tensors) used by the demo, the tests and the benchmarks.

They double as a reference for writing your own: `model_fn(config) -> (model, optimizer)` (or a `Trainable`
with an LR scheduler and a GradScaler, `scheduled_model_fn`), and either a step (`classifier_step_fn`: the engine
runs the loop, the recommended way) or a whole pass of your own (`classifier_train_fn`, the escape hatch, which
trains to the same weights) with `eval_fn(model, data, config) -> dict`. `data` is whatever the partition holds; here
a tuple `(x, y)` of tensors.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from framework.trainable import Trainable


def mlp_model_fn(config: dict[str, Any]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP: `in_features` -> `hidden` x `layers` -> `classes`; SGD (momentum 0.9) or Adam."""
    d, h, k = int(config.get("in_features", 64)), int(config.get("hidden", 64)), int(config.get("classes", 10))
    layers: list[torch.nn.Module] = []
    for _ in range(int(config.get("layers", 1))):
        layers += [torch.nn.Linear(d, h), torch.nn.ReLU()]
        d = h
    model = torch.nn.Sequential(*layers, torch.nn.Linear(d, k))
    lr, wd = float(config.get("lr", 0.01)), float(config.get("weight_decay", 0.0))
    if config.get("optimizer", "sgd") == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=wd)
    return model, opt


def classifier_step_fn(model: torch.nn.Module, batch: Any, config: dict) -> tuple[torch.Tensor, dict]:
    """One step of a classifier (`ModelSelection(step_fn=...)`): the batch's cross-entropy and accuracy.

    The engine batches the partition by `config["batch_size"]`, moves each batch to the model's device, and runs
    backward and the optimizer (`framework.engine.steps`); evaluated without an `eval_step`, the same function gives
    the validation loss and accuracy."""
    x, y = batch  # (B, D), (B,)
    logits = model(x)  # (B, classes)
    return F.cross_entropy(logits, y), {"accuracy": (logits.argmax(1) == y).float().mean()}


def classifier_train_fn(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any, config: dict, freezing: Any = None,
    gang_size: int = 1,
) -> dict:
    """One shuffled pass of mini-batch SGD over the partition; returns the mean training loss and accuracy.

    With `ModelSelection(freezing=...)` the engine passes a `FreezingController`: the forward pass then goes through
    it (it may skip frozen layers using cached activations, keyed by the row index in the partition) and it sees
    every step's loss and learning rate. In a data-parallel gang of `gang_size` workers, each takes a
    `batch_size / gang_size` share of every step, so a step's global batch is the config's `batch_size` as in a hop.
    """
    x, y = data  # (N, D), (N,)
    device = next(model.parameters()).device
    bs = max(1, int(config.get("batch_size", 32)) // gang_size)
    perm = torch.randperm(len(x))
    total_loss, correct = 0.0, 0
    for i in range(0, len(x), bs):
        idx = perm[i : i + bs]
        xb, yb = x[idx].to(device), y[idx].to(device)
        optimizer.zero_grad(set_to_none=True)
        logits = model(xb) if freezing is None else freezing.forward(xb, idx)  # (B, classes)
        loss = F.cross_entropy(logits, yb)
        loss.backward()
        optimizer.step()
        if freezing is not None:
            freezing.after_step(loss.item(), optimizer.param_groups[0]["lr"])
        total_loss += loss.item() * len(idx)
        correct += (logits.argmax(1) == yb).sum().item()
    return {"loss": total_loss / len(x), "accuracy": correct / len(x), "num_examples": len(x)}


def scheduled_model_fn(config: dict[str, Any]) -> Trainable:
    """`mlp_model_fn` plus an epoch-wise cosine learning-rate schedule over `config["epochs"]` epochs and a
    `GradScaler` for mixed precision (enabled by `config["amp"]`: float16 on CUDA, bfloat16 on CPU). The engine steps
    the schedule once per epoch of the config, and the scheduler's and the scaler's state hop with the model."""
    model, optimizer = mlp_model_fn(config)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=int(config.get("epochs", 10)))
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where the worker puts the model
    scaler = torch.amp.GradScaler(device, enabled=bool(config.get("amp", False)), growth_interval=20)
    return Trainable(model, optimizer, lr_scheduler=schedule, grad_scaler=scaler)


def scheduled_train_fn(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any, config: dict, epoch: int,
    grad_scaler: torch.amp.GradScaler,
) -> dict:
    """One shuffled pass like `classifier_train_fn`, under autocast with loss scaling when `grad_scaler` is enabled.

    The engine passes `epoch` (the config's own, from 0) and the config's `grad_scaler` because the signature names
    them. Reports the learning rate the pass used and the loss scale after it.
    """
    x, y = data  # (N, D), (N,)
    device = next(model.parameters()).device
    amp = grad_scaler.is_enabled()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    bs = int(config.get("batch_size", 32))
    perm = torch.randperm(len(x))
    total_loss = 0.0
    for i in range(0, len(x), bs):
        idx = perm[i : i + bs]
        xb, yb = x[idx].to(device), y[idx].to(device)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=amp):
            loss = F.cross_entropy(model(xb).float(), yb)  # logits (B, classes) in float32 for the loss
        grad_scaler.scale(loss).backward()
        grad_scaler.step(optimizer)
        grad_scaler.update()
        total_loss += loss.item() * len(idx)
    return {"loss": total_loss / len(x), "lr": optimizer.param_groups[0]["lr"],
            "loss_scale": grad_scaler.get_scale() if amp else 1.0, "num_examples": len(x)}


def classifier_eval_fn(model: torch.nn.Module, data: Any, config: dict) -> dict:
    """Loss and accuracy on the partition (called under no_grad by the engine)."""
    x, y = data
    device = next(model.parameters()).device
    logits = model(x.to(device))
    y = y.to(device)
    return {
        "loss": F.cross_entropy(logits, y).item(),
        "accuracy": (logits.argmax(1) == y).float().mean().item(),
        "num_examples": len(x),
    }


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits (1797 x 64, 10 classes), scaled to [0, 1]; works offline. scikit-learn is an
    optional dependency: `pip install 'modelhopper[examples]'`. The file `load_digits` reads is read directly where
    it is found: importing `sklearn.datasets` (and SciPy with it) took seconds of the demo's start-up."""
    spec = importlib.util.find_spec("sklearn")  # (None when it is not installed; nothing is imported)
    folders = spec.submodule_search_locations if spec is not None else None
    path = os.path.join(folders[0], "datasets", "data", "digits.csv.gz") if folders else ""
    if os.path.isfile(path):
        data = np.loadtxt(path, delimiter=",")  # as `load_digits` reads it: 64 pixels (0..16), then the label
        x, y = data[:, :-1], data[:, -1]
    else:
        try:
            from sklearn.datasets import load_digits
        except ImportError as e:  # ModuleNotFoundError, or a scikit-learn that does not import
            raise ImportError(
                "framework.examples.digits_arrays loads scikit-learn's bundled digits data set, but scikit-learn "
                f"cannot be imported ({e}): install it with `pip install 'modelhopper[examples]'` (or `pip install "
                "scikit-learn`)"
            ) from e
        x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def arrays_as_parquet(folder: str, x: np.ndarray, y: np.ndarray, files: tuple[int, int] = (1, 1),
                      valid_fraction: float = 0.2, row_group_size: int | None = None) -> str:
    """Features `x` (rows x columns) and labels `y` as Parquet files under `folder`/train and `folder`/valid, one
    column per feature (`f0`, `f1`, ...: float32) and `label` (int64): the first rows for training, the last
    `valid_fraction` of them for validation, in `files` (train, valid) files of consecutive rows each. What
    `PartitionedDataset.from_parquet(folder + "/train", folder + "/valid", label="label")` reads; returns `folder`.
    pyarrow comes with Ray Data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cut = int(len(x) * (1 - valid_fraction))
    for split, rows, count in (("train", np.arange(cut), files[0]), ("valid", np.arange(cut, len(x)), files[1])):
        os.makedirs(os.path.join(folder, split), exist_ok=True)
        for i, chunk in enumerate(np.array_split(rows, count)):
            table = pa.table({**{f"f{k}": x[chunk, k].astype(np.float32) for k in range(x.shape[1])},
                              "label": y[chunk].astype(np.int64)})
            pq.write_table(table, os.path.join(folder, split, f"part-{i}.parquet"), row_group_size=row_group_size)
    return folder


def synthetic_classification(n: int, d: int, classes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable synthetic tabular task: labels from a random 2-layer teacher network plus noise."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    w1 = rng.standard_normal((d, 64)).astype(np.float32) / np.sqrt(d)
    w2 = rng.standard_normal((64, classes)).astype(np.float32) / 8.0
    logits = np.maximum(x @ w1, 0) @ w2 + 0.1 * rng.standard_normal((n, classes)).astype(np.float32)
    return x, logits.argmax(1).astype(np.int64)


def feature_classifier_train_fn(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any, config: dict) -> dict:
    """`classifier_train_fn` for partitions whose inputs may be a dict of features (`ModelSelection(extract=...)`,
    `framework.planner.transfer_on_engine`): one shuffled pass, same batches and random stream on raw tensors."""
    from framework.planner.engine import feature_len, take

    x, y = data  # x: (N, ...) tensor or {name: (N, ...) tensor}
    device = next(model.parameters()).device
    bs, n = int(config.get("batch_size", 32)), feature_len(x)
    perm = torch.randperm(n)
    total_loss, correct = 0.0, 0
    for i in range(0, n, bs):
        idx = perm[i : i + bs]
        xb, yb = _to_device(take(x, idx), device), y[idx].to(device)
        optimizer.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * len(idx)
        correct += (logits.argmax(1) == yb).sum().item()
    return {"loss": total_loss / n, "accuracy": correct / n, "num_examples": n}


def feature_classifier_eval_fn(model: torch.nn.Module, data: Any, config: dict) -> dict:
    """`classifier_eval_fn` for tensor or dict-of-features inputs (called under no_grad by the engine)."""
    from framework.planner.engine import feature_len

    x, y = data
    device = next(model.parameters()).device
    logits = model(_to_device(x, device))
    y = y.to(device)
    return {
        "loss": F.cross_entropy(logits, y).item(),
        "accuracy": (logits.argmax(1) == y).float().mean().item(),
        "num_examples": feature_len(x),
    }


def _to_device(x: Any, device: torch.device) -> Any:
    return {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)
