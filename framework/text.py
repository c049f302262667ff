"""Text for terminals, shared by every command line of the project (`python -m framework`, `python -m simulators`, the
experiment scripts): an argument parser whose errors are one line, `printable`, which makes any text safe to print on
one, and `text_table` and `json_records`, which print rows as pandas' `DataFrame.to_string` and `to_json` do, for a
command that starts without pandas (`modelhopper list`).

Standard library only, so the simulators and the experiment scripts import it without torch, Ray or the engine.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["OneLineParser", "json_records", "printable", "text_table"]


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


_CELL_ESCAPES = str.maketrans({"\t": "\\t", "\n": "\\n", "\r": "\\r"})


def text_table(columns: Mapping[str, Sequence[str | int]]) -> str:
    """The table `pandas.DataFrame(columns).to_string(index=False)` prints, of columns of text (`str`) or of ints:
    each column as wide as its widest cell or its name, every cell and name right-aligned, one space between columns;
    the name of a column of ints has one space more in front (pandas' room for a sign); tabs and line breaks in a cell
    as `\\t`, `\\n`, `\\r`."""
    lines: list[list[str]] = []
    for name, values in columns.items():
        ints = bool(values) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        cells = [" " + name if ints else name, *(str(v).translate(_CELL_ESCAPES) for v in values)]
        width = max(len(c) for c in cells)
        lines.append([c.rjust(width) for c in cells])
    return "\n".join(" ".join(row) for row in zip(*lines))


#: how pandas' JSON writer escapes a character below 0x80 (it leaves `&`, `<`, `>` and DEL as they are)
_JSON_ESCAPES = {**{i: f"\\u{i:04x}" for i in range(0x20)}, 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f",
                 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\", 0x2F: "\\/"}


def _json_str(text: str) -> str:
    out = text.translate(_JSON_ESCAPES)
    if not out.isascii():
        out = "".join(c if ord(c) < 0x80 else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else
                      f"\\u{0xD800 + ((ord(c) - 0x10000) >> 10):04x}\\u{0xDC00 + ((ord(c) - 0x10000) & 0x3FF):04x}"
                      for c in out)
    return f'"{out}"'


def _json_float(value: float) -> str:
    """A float as pandas' JSON writer (ujson, `double_precision=10`) writes it: at most 10 decimals, trailing zeros
    dropped but one, `%.10g` beyond 1e16 or below 1e-15; NaN and infinities as null."""
    if not math.isfinite(value):
        return "null"
    neg, value = value < 0, abs(value)
    if value > 1e16 - 1 or (value != 0.0 and value < 1e-15):
        return "%.10g" % (-value if neg else value)
    whole = int(value)
    tmp = (value - whole) * 1e10
    frac = int(tmp)
    diff = tmp - frac
    if diff > 0.5 or (diff == 0.5 and (frac == 0 or frac & 1)):
        frac += 1
    if frac >= 10**10:
        frac, whole = 0, whole + 1
    decimals = str(frac).rjust(10, "0").rstrip("0") or "0"
    return f"{'-' if neg else ''}{whole}.{decimals}"


def _json_value(value: Any, level: int, as_float: bool = False) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and not as_float:
        return str(value)
    if isinstance(value, (int, float)):
        return _json_float(float(value))
    if isinstance(value, str):
        return _json_str(value)
    if isinstance(value, Mapping):
        items = [f"{' ' * (level + 1)}{_json_str(str(k))}:{_json_value(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * level + "}"
    if isinstance(value, (list, tuple)):
        items = [" " * (level + 1) + _json_value(v, level + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * level + "]"
    return _json_str(str(value))


def json_records(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], int_columns: Sequence[str] = ()) -> str:
    """The JSON `pandas.DataFrame(rows, columns=columns).to_json(orient="records", indent=1)` writes (with each of
    `int_columns` of pandas' nullable `Int64`), for rows of JSON values: a column of numbers and Nones (NaN) holds
    floats, as a DataFrame's does, so its ints are written as floats; floats with at most 10 decimals; `/` escaped
    as `\\/`, non-ASCII as `\\uXXXX`."""
    floats = set()
    for c in columns:
        values = [r.get(c) for r in rows]
        numbers = [v for v in values if v is not None]
        if c not in int_columns and numbers and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    for v in numbers):
            if len(numbers) < len(values) or any(isinstance(v, float) for v in numbers):
                floats.add(c)
    records = [" {\n" + ",\n".join(f"  {_json_str(c)}:{_json_value(r.get(c), 2, c in floats)}" for c in columns)
               + "\n }" for r in rows]
    return "[\n" + ",\n".join(records) + "\n]"
