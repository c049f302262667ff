"""User functions for the fault-tolerance tests (importable, so a subprocess driver and a resume can share them)."""

from __future__ import annotations

import os
import time

from framework.callbacks import Callback
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn

__all__ = ["classifier_eval_fn", "classifier_train_fn", "mlp_model_fn", "slow_train_fn", "gated_train_fn",
           "CloseGateAtRoundEnd"]


def slow_train_fn(model, optimizer, data, config):
    """A real training pass plus a pause (`sleep` seconds)."""
    time.sleep(float(config.get("sleep", 0.2)))
    return classifier_train_fn(model, optimizer, data, config)


def gated_train_fn(model, optimizer, data, config):
    """A real training pass that first waits while the file `config["gate"]` exists (a closed gate).

    Tests close the gate at a known point of the run (from a `FaultPlan` observer) and open it when the event they
    wait for has happened, so a round cannot end before, say, a new worker has joined: no sleeps, no races.
    """
    deadline = time.time() + 120
    while os.path.exists(config["gate"]):
        if time.time() > deadline:
            raise TimeoutError(f"the gate {config['gate']} stayed closed for 120 s")
        time.sleep(0.01)
    return classifier_train_fn(model, optimizer, data, config)


class CloseGateAtRoundEnd(Callback):
    """Closes the gate of `gated_train_fn` (creates the file `gate`) as a round of a synchronous run ends, once per
    `armed`: the driver calls it after the round's last unit and before it opens the next round's units, so the run
    then waits at that point however fast the machine is. (A test that watched for the round's end and then closed
    the gate raced the rest of a run that takes a second.)"""

    def __init__(self, gate, armed: bool = True) -> None:
        self.gate, self.armed = gate, armed

    def on_round_end(self, round: int) -> None:
        if self.armed:
            self.armed = False
            self.gate.write_text("")
