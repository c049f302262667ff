"""Code an attacker plants in a run directory: importing this module or calling its functions creates the file
named by `$MODELHOPPER_PLANTED_MARKER`, the proof that a reader ran code the run named. The tests never import it: `PAYLOAD` in test_run_integrity.py is a pickle that imports it and calls `touch`."""

from __future__ import annotations

import os


def touch(path: str | None = None) -> None:
    path = path or os.environ.get("MODELHOPPER_PLANTED_MARKER")
    if path:
        with open(path, "a") as f:
            f.write("planted code ran\n")


touch()  # importing the module is already running it


def model_fn(config):  # noqa: ARG001 - named by a planted meta row
    touch()
