"""What every command line of the project shares (`python -m framework`, `python -m simulators`, the experiment
scripts): an argument parser whose errors are one line, and `printable`, which makes any text safe to print on one.

Standard library only, so the simulators and the experiment scripts import it without torch, Ray or the engine.
"""

from __future__ import annotations

import argparse

__all__ = ["OneLineParser", "printable"]


def printable(text: str) -> str:
    """`text` with every character a terminal would not show as itself escaped, so that printing it neither raises
    nor breaks the line: a byte that was not UTF-8 (a file name's, kept by Python as a lone surrogate U+DC80..U+DCFF)
    as `\\xff`, any other lone surrogate as `\\ud800`, a control or format character as `repr` writes it (`\\n`,
    `\\x1b`, `\\u202e`). Everything else, backslashes and non-ASCII letters included, is left as it is:
    `printable("run-\\udcff\\n") == "run-\\\\xff\\\\n"`."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF
                   else repr(c)[1:-1] for c in text)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr, `prog: error: message (see --help)`, with exit code 2
    (argparse prints the whole usage first). Sub-parsers made by `add_subparsers` are of this class too. What the
    user typed is quoted `printable`: an argument with a newline or a byte that is not UTF-8 stays on the line."""

    def error(self, message: str):  # noqa: ANN201 - argparse's signature
        self.exit(2, f"{printable(f'{self.prog}: error: {message} (see --help)')}\n")
