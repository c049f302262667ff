"""Shared pieces of the automl tests: a small space, a deterministic synthetic objective, every procedure."""

from __future__ import annotations

import math

import optuna
import pytest

import automl

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {
    "lr": automl.loguniform(1e-4, 1e-1),
    "momentum": automl.uniform(0.5, 0.99),
    "layers": automl.randint(1, 4),
    "act": ["relu", "tanh", "gelu"],
    "batch_size": 32,
}
GRID = {"lr": [1e-3, 1e-2], "act": ["relu", "tanh"], "batch_size": [32]}


def quality(config: dict) -> float:
    """A deterministic synthetic 'final loss' of a config (lower is better)."""
    q = abs(math.log10(config["lr"]) + 2.0) + 0.1 * config.get("layers", 2)
    q += 0.3 * abs(config.get("momentum", 0.9) - 0.9) + {"relu": 0.0, "tanh": 0.2, "gelu": 0.1}[config["act"]]
    return q + 0.01


def objective(config: dict, epoch: int) -> dict[str, float]:
    """loss = quality(config) / (epoch + 1): every config improves, the ranking is fixed by the config."""
    loss = quality(config) / (epoch + 1)
    return {"train_loss": loss, "valid_loss": loss, "valid_accuracy": 1.0 / (1.0 + loss)}


# name -> (factory(seed), space the configs must lie in); module-level so everything pickles.
PROCEDURES = {
    "grid": (lambda seed: automl.GridSearch(GRID, epochs=2), GRID),
    "random": (lambda seed: automl.RandomSearch(SPACE, num_samples=5, epochs=3, seed=seed), SPACE),
    "hyperband": (lambda seed: automl.HyperBand(SPACE, max_epochs=9, eta=3, seed=seed), SPACE),
    "asha": (lambda seed: automl.ASHA(SPACE, max_epochs=9, eta=3, max_configs=12, seed=seed), SPACE),
    "tpe": (lambda seed: automl.TPE(SPACE, num_samples=8, epochs=2, concurrency=3, seed=seed), SPACE),
    "pbt": (lambda seed: automl.PBT(SPACE, population=6, epochs=6, perturbation_interval=2, seed=seed), SPACE),
    "pb2": (lambda seed: automl.PB2(SPACE, population=6, epochs=6, perturbation_interval=2, seed=seed), SPACE),
    "bohb": (lambda seed: automl.BOHB(SPACE, max_epochs=9, eta=3, iterations=2, concurrency=3, seed=seed), SPACE),
}


@pytest.fixture(name="objective")
def objective_fixture():
    """The synthetic objective: loss = quality(config) / (epoch + 1)."""
    return objective


@pytest.fixture(name="quality")
def quality_fixture():
    return quality


@pytest.fixture(name="space")
def space_fixture():
    return dict(SPACE)


@pytest.fixture(params=sorted(PROCEDURES))
def procedure_case(request):
    """(name, factory(seed), space) for every built-in procedure."""
    factory, space = PROCEDURES[request.param]
    return request.param, factory, space
