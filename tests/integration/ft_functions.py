"""User functions for the fault-tolerance tests (importable, so a subprocess driver and a resume can share them)."""

from __future__ import annotations

import os
import time

from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn

__all__ = ["classifier_eval_fn", "mlp_model_fn", "slow_train_fn", "hang_once_train_fn", "flaky_train_fn"]


def slow_train_fn(model, optimizer, data, config):
    """A real training pass plus a pause, so failures can land in the middle of a run."""
    time.sleep(float(config.get("sleep", 0.2)))
    return classifier_train_fn(model, optimizer, data, config)


def hang_once_train_fn(model, optimizer, data, config):
    """Hangs forever the first time it trains config `hang_hidden` (a marker file records the first attempt)."""
    marker = config.get("marker")
    if marker and config["hidden"] == config.get("hang_hidden") and not os.path.exists(marker):
        open(marker, "w").close()
        while True:
            time.sleep(1)
    return classifier_train_fn(model, optimizer, data, config)


def flaky_train_fn(model, optimizer, data, config):
    """Raises once per run (first call that finds no marker file), then trains normally."""
    marker = config.get("marker")
    if marker and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("transient failure in user code")
    return classifier_train_fn(model, optimizer, data, config)
