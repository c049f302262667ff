"""Argument checks shared by the procedures' constructors: each error names the parameter, its value and the rule."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def check_int(name: str, value: Any, minimum: int) -> int:
    """`value` as an int >= `minimum` (bools are rejected: `True` is not an epoch count)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` is {value!r}, but must be an int >= {minimum}")
    if value < minimum:
        raise ValueError(f"`{name}` is {value!r}, but must be >= {minimum}")
    return int(value)


def check_optional_int(name: str, value: Any, minimum: int) -> int | None:
    return None if value is None else check_int(name, value, minimum)


def check_seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"`seed` is {value!r}, but must be an int >= 0")
    return int(value)


def check_positive_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` is {value!r}, but must be a finite number > 0")
    return float(value)
