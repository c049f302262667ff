"""What every command line of the project shares (`python -m framework`, `python -m simulators`, the experiment
scripts): an argument parser whose errors are one line.

Standard library only, so the simulators and the experiment scripts import it without torch, Ray or the engine.
"""

from __future__ import annotations

import argparse

__all__ = ["OneLineParser"]


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr, `prog: error: message (see --help)`, with exit code 2
    (argparse prints the whole usage first). Sub-parsers made by `add_subparsers` are of this class too."""

    def error(self, message: str):  # noqa: ANN201 - argparse's signature
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
