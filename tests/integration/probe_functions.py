"""User functions that report what the engine did to them (importable, so Ray workers and replay find them by name).

- `score_eval_fn` reports `config["q"]` as `score`: the best config of a run is known from the configs alone.
- `draw_train_fn` / `draw_eval_fn` report a random draw: what the unit's seed produced.
- `fingerprint_train_fn` reports fingerprints of the weights and optimizer state a unit starts from and ends with.
- `typed_model_fn` fails a config whose values are not of the types `TYPED` names (a value read back as text fails),
  and `typed_eval_fn` reports `config["wd"]` as `wd`: what model_fn got, in a run, on its resume and on its replay.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def linear_model_fn(config: dict[str, Any]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(64, 10)
    return model, torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.1)), momentum=0.9)


def noop_train_fn(model, optimizer, data, config) -> dict:
    return {}


def score_eval_fn(model, data, config) -> dict:
    return {"score": float(config["q"])}


def draw_train_fn(model, optimizer, data, config) -> dict:
    return {"draw": torch.rand(1).item()}


def draw_eval_fn(model, data, config) -> dict:
    return {"draw": torch.rand(1).item()}


def _weights_sum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _momentum_sum(optimizer: torch.optim.Optimizer) -> float:
    bufs = [s["momentum_buffer"] for s in optimizer.state.values() if s.get("momentum_buffer") is not None]
    return float(sum(b.double().sum() for b in bufs)) if bufs else 0.0


def fingerprint_train_fn(model, optimizer, data, config) -> dict:
    """One SGD step on the partition; reports sums of the weights and momentum before and after it, and the lr."""
    x, y = data  # (N, 64), (N,)
    start, start_momentum = _weights_sum(model), _momentum_sum(optimizer)
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return {
        "loss": loss.item(),
        "start_sum": start,
        "end_sum": _weights_sum(model),
        "start_momentum": start_momentum,
        "end_momentum": _momentum_sum(optimizer),
        "lr": optimizer.param_groups[0]["lr"],
    }


def loss_eval_fn(model, data, config) -> dict:
    x, y = data
    return {"loss": F.cross_entropy(model(x), y).item()}


#: the exact type each of these config values must reach model_fn with
TYPED = {"lr": float, "hidden": int, "shape": list, "wd": float, "steps": int, "flag": bool, "scale": float}


def typed_model_fn(config: dict[str, Any]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """`framework.examples.mlp_model_fn`, once every value `TYPED` names has exactly its type."""
    from framework.examples import mlp_model_fn

    wrong = {k: type(config.get(k)).__name__ for k, t in TYPED.items() if type(config.get(k)) is not t}
    if wrong:
        raise TypeError(f"config values of another type than TYPED: {wrong}")
    return mlp_model_fn(config)


def typed_eval_fn(model, data, config) -> dict:
    """`framework.examples.classifier_eval_fn`'s metrics, and `config["wd"]` as it reached the worker."""
    from framework.examples import classifier_eval_fn

    return {**classifier_eval_fn(model, data, config), "wd": config["wd"]}
