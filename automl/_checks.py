"""Argument checks shared by the procedures' constructors, the search spaces and the stoppers: each error names the
parameter, its value and the rule, in one line.

`json_exact` is the one rule for what a config may hold (every procedure's draw, a person's `add_config` and the
run's catalog apply it): JSON values that read back as they were written, so that `model_fn` gets the same config in
a run, on its resume and on its replay.
"""

from __future__ import annotations

import math
import sys
from decimal import Decimal
from typing import Any

import numpy as np

#: the range of ints a config, a count or a catalog row holds exactly: int64, what SQLite and Parquet store (JSON
#: readers other than Python's lose ints beyond 2**53, but int64 is what this library reads back)
MIN_INT, MAX_INT = -(2**63), 2**63 - 1
#: how deep the lists and dicts of one config value may nest
MAX_DEPTH = 32
_SHOWN = 80  # characters of a value's repr an error shows


def show(value: Any) -> str:
    """`repr(value)` for an error line: on one line, at most about 80 characters, an int too long to print in full
    as its magnitude (`1.00000e+400 (an int)`)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"{format(Decimal(value), '.6g')} (an int)"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 (a user's object whose repr raises is still named)
        text = f"<{_type_name(value)} object>"
    text = " ".join(text.split())
    text = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def _type_name(value: Any) -> str:
    """The type of `value` with its article: "a set", "an int", "a datetime.datetime"."""
    cls = type(value)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def finite_real(value: Any) -> float | None:
    """`value` as a finite float, or None when it is not a real number (bools are not; numpy's are) or is not
    finite as a float (nan, inf, an int beyond a float's range such as 10**400)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def check_int(name: str, value: Any, minimum: int, maximum: int = MAX_INT) -> int:
    """`value` as an int in [`minimum`, `maximum`] (bools are rejected: `True` is not an epoch count); `maximum`
    defaults to the largest int64, what a run's catalog stores."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` is {show(value)}, but must be an int >= {minimum}")
    if value < minimum:
        raise ValueError(f"`{name}` is {show(value)}, but must be >= {minimum}")
    if value > maximum:
        raise ValueError(f"`{name}` is {show(value)}, but must be <= {maximum}"
                         + (" (an int64, what a run's catalog stores)" if maximum == MAX_INT else ""))
    return int(value)


def check_optional_int(name: str, value: Any, minimum: int, maximum: int = MAX_INT) -> int | None:
    return None if value is None else check_int(name, value, minimum, maximum)


def check_seed(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"`seed` is {show(value)}, but must be an int >= 0")
    return check_int("seed", value, 0)


def check_positive_real(name: str, value: Any) -> float:
    f = finite_real(value)
    if f is None or f <= 0:
        raise ValueError(f"`{name}` is {show(value)}, but must be a finite number > 0")
    return f


def check_fraction(name: str, value: Any, low_open: bool = False, high: float = 1.0) -> float:
    """`value` as a float in [0, `high`] (`low_open`: in (0, `high`])."""
    f = finite_real(value)
    if f is None or not (0 < f if low_open else 0 <= f) or f > high:
        raise ValueError(f"`{name}` is {show(value)}, but must be in {'(' if low_open else '['}0, {high:g}]")
    return f


# ---- what a config holds -------------------------------------------------------------------------------------------
_RULE = ("a config holds JSON values only: None, bool, int, float, str, and lists and dicts (str keys) of them; "
         "numpy numbers and 0-d numpy arrays and torch tensors become Python numbers")


def json_exact(name: str, value: Any) -> Any:
    """`value` as a config holds it, or a `TypeError`/`ValueError` naming `name`, the value and its type.

    Kept as they are: None, bool, int in [-2**63, 2**63 - 1], finite float, UTF-8 str. Converted, because the value
    is the same: numpy's bools, ints and floats (`np.float32(0.05)` becomes the float it equals,
    0.05000000074505806), 0-d numpy arrays and 0-d torch tensors (their `.item()`), subclasses of int, float and str
    (an `IntEnum` member becomes its int), and tuples (lists: JSON has no tuple, so a replay would get a list).
    Lists and dicts are converted entry by entry (dict keys must be str; at most `MAX_DEPTH` levels). Refused:
    everything else (sets, bytes, datetimes, objects, functions, complex numbers, arrays and tensors with any
    dimension), non-finite floats, ints beyond int64, floats a float64 cannot hold (`np.longdouble` with more
    precision) and text that is not UTF-8 (a lone surrogate).
    """
    return _exact(name, value, 0)


def _exact(name: str, value: Any, depth: int) -> Any:
    if value is None or type(value) is bool:
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if not MIN_INT <= v <= MAX_INT:
            raise ValueError(f"`{name}` is {show(value)}, but an int in a config must be in [-2**63, 2**63 - 1] "
                             "(what SQLite and Parquet hold exactly)")
        return v
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"`{name}` is {show(value)}, but a float in a config must be finite (JSON has no nan "
                             "or inf)")
        if not isinstance(value, (float, np.float16, np.float32)) and np.longdouble(v) != value:
            raise ValueError(f"`{name}` is {show(value)}, {_type_name(value)}, but a float in a config must be "
                             "one a float64 holds exactly")
        return v
    if isinstance(value, str):
        v = str.__str__(value)
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"`{name}` is {show(value)}, but a str in a config must be UTF-8 text: it holds a lone "
                             "surrogate") from None
        return v
    if isinstance(value, (list, tuple, dict)):
        if depth >= MAX_DEPTH:
            raise ValueError(f"`{name}` is nested more than {MAX_DEPTH} lists or dicts deep, but a config value may "
                             f"nest at most {MAX_DEPTH}")
        if not isinstance(value, dict):
            return [_exact(f"{name}[{i}]", v, depth + 1) for i, v in enumerate(value)]
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"`{name}` has the key {show(k)}, {_type_name(k)}, but the keys of a dict in a "
                                "config must be str (JSON's are)")
            out[_exact(f"{name} key", k, depth + 1)] = _exact(f"{name}[{k!r}]", v, depth + 1)
        return out
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype != object:
        return _exact(name, value[()], depth)
    torch = sys.modules.get("torch")  # (a tensor exists only where torch was imported: automl never imports it)
    if torch is not None and isinstance(value, torch.Tensor):
        if value.ndim == 0 and not value.is_complex():
            return _exact(name, value.item(), depth)
        raise TypeError(f"`{name}` is a torch.Tensor of shape {tuple(value.shape)} ({value.dtype}), but {_RULE} "
                        "(convert it: .tolist())")
    if isinstance(value, np.ndarray):
        raise TypeError(f"`{name}` is a numpy.ndarray of shape {value.shape} ({value.dtype}), but {_RULE} (convert "
                        "it: .tolist())")
    raise TypeError(f"`{name}` is {show(value)}, {_type_name(value)}, but {_RULE}")
