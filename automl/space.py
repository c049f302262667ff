"""Search spaces: what a procedure may suggest for each hyper-parameter.

A space is a dict of name -> domain:

* a `list` is a categorical choice among its entries (any Python values);
* `uniform(lo, hi)`, `loguniform(lo, hi)` are floats in `[lo, hi]` (log-uniform needs `0 < lo`);
* `randint(lo, hi)` is an int in `[lo, hi]`, **both ends inclusive** (as Optuna's `IntDistribution`);
* anything else (a number, a string, a tuple, a dict, ...) is a constant copied into every config.

`SearchSpace(space)` validates the dict once and then samples configs with a `numpy.random.Generator`, converts
to Optuna distributions (and back), checks membership, and clips values into the space (PBT's perturbations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

# Optuna stores only these as categorical choices; other choices are encoded by their index.
_OPTUNA_CHOICE_TYPES = (type(None), bool, int, float, str)


def _check_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"`{name}` is {value!r}, but must be a finite real number")
    return value


class Domain:
    """A range of values for one hyper-parameter (the base of `Uniform`, `LogUniform`, `RandInt`, `Categorical`)."""

    def sample(self, rng: np.random.Generator) -> Any:
        """One value drawn from the domain.

        Args:
            rng: The generator every draw comes from, so the same seed gives the same value.

        Returns:
            A value for which `contains` is true: a `float` for `Uniform` and `LogUniform`, an `int` for `RandInt`,
            one of the choices for `Categorical`, the value itself for `Constant`.
        """
        raise NotImplementedError

    def contains(self, value: Any) -> bool:
        """Whether `value` lies in the domain.

        Numeric domains accept real numbers (ints and floats, not bools; `RandInt` only ints) within `[lo, hi]`, both
        ends inclusive. `Categorical` and `Constant` accept a value equal to a choice and of exactly its type, so
        `1` is not in `[1.0, 2.0]` and `True` is not in `[1, 2]`.
        """
        raise NotImplementedError

    def clip(self, value: Any) -> Any:
        """The value of the domain nearest to `value` (numeric domains); categorical values pass unchanged."""
        return value

    def to_optuna(self) -> BaseDistribution:
        """The Optuna distribution of the domain, for Optuna's ask-and-tell interface.

        `Uniform` gives a `FloatDistribution`, `LogUniform` one with `log=True`, `RandInt` an `IntDistribution`
        over the same inclusive `[lo, hi]`, and `Categorical` a `CategoricalDistribution` of its choices, or of
        their indices when Optuna cannot store them (see `Categorical.optuna_native`).

        Raises:
            NotImplementedError: For `Constant`, which is not searched; `SearchSpace.to_optuna` leaves it out.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class Uniform(Domain):
    """A float drawn uniformly from `[lo, hi]`."""

    lo: float
    hi: float

    def __post_init__(self) -> None:
        _check_real("lo", self.lo)
        _check_real("hi", self.hi)
        if not self.lo < self.hi:
            raise ValueError(f"`lo` is {self.lo!r}, but must be < `hi` ({self.hi!r})")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.lo, self.hi))

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.lo <= value <= self.hi

    def clip(self, value: Any) -> float:
        return float(min(max(value, self.lo), self.hi))

    def to_optuna(self) -> FloatDistribution:
        return FloatDistribution(float(self.lo), float(self.hi))


@dataclass(frozen=True)
class LogUniform(Uniform):
    """A float whose logarithm is drawn uniformly from `[log lo, log hi]` (`0 < lo < hi`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.lo > 0:
            raise ValueError(f"`lo` is {self.lo!r}, but must be > 0 for a log-uniform domain")

    def sample(self, rng: np.random.Generator) -> float:
        # exp(log) can land a rounding error outside the ends; clip keeps the value inside.
        return self.clip(math.exp(rng.uniform(math.log(self.lo), math.log(self.hi))))

    def to_optuna(self) -> FloatDistribution:
        return FloatDistribution(float(self.lo), float(self.hi), log=True)


@dataclass(frozen=True)
class RandInt(Domain):
    """An int drawn uniformly from `[lo, hi]`, both ends inclusive (as Optuna's `IntDistribution`)."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        for name, v in (("lo", self.lo), ("hi", self.hi)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"`{name}` is {v!r}, but must be an int")
        if not self.lo <= self.hi:
            raise ValueError(f"`lo` is {self.lo!r}, but must be <= `hi` ({self.hi!r}); `hi` is inclusive")

    def sample(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.lo, self.hi, endpoint=True))

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and self.lo <= value <= self.hi

    def clip(self, value: Any) -> int:
        return int(min(max(round(value), self.lo), self.hi))

    def to_optuna(self) -> IntDistribution:
        return IntDistribution(int(self.lo), int(self.hi))


@dataclass(frozen=True)
class Categorical(Domain):
    """One of `choices`, each with the same probability (a list in a space dict)."""

    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        if len(self.choices) == 0:
            raise ValueError("`choices` is [], but must hold at least one value")

    @property
    def optuna_native(self) -> bool:
        """Whether Optuna can store the choices themselves (else they are encoded by index)."""
        return all(isinstance(c, _OPTUNA_CHOICE_TYPES) for c in self.choices)

    def index(self, value: Any) -> int:
        """The position of `value` in `choices` (the first choice equal to it and of exactly its type).

        Raises:
            ValueError: If `value` is not one of the choices.
        """
        for i, c in enumerate(self.choices):
            if type(c) is type(value) and c == value:
                return i
        raise ValueError(f"{value!r} is not one of the choices {list(self.choices)}")

    def sample(self, rng: np.random.Generator) -> Any:
        return self.choices[int(rng.integers(len(self.choices)))]

    def contains(self, value: Any) -> bool:
        try:
            self.index(value)
        except ValueError:
            return False
        return True

    def to_optuna(self) -> CategoricalDistribution:
        if self.optuna_native:
            return CategoricalDistribution(self.choices)
        return CategoricalDistribution(tuple(range(len(self.choices))))


@dataclass(frozen=True)
class Constant(Domain):
    """A fixed value copied into every config."""

    value: Any

    def sample(self, rng: np.random.Generator) -> Any:
        return self.value

    def contains(self, value: Any) -> bool:
        return type(value) is type(self.value) and value == self.value


def uniform(lo: float, hi: float) -> Uniform:
    """A float drawn uniformly from `[lo, hi]` (`lo < hi`)."""
    return Uniform(lo, hi)


def loguniform(lo: float, hi: float) -> LogUniform:
    """A float drawn log-uniformly from `[lo, hi]` (`0 < lo < hi`), e.g. a learning rate."""
    return LogUniform(lo, hi)


def randint(lo: int, hi: int) -> RandInt:
    """An int drawn uniformly from `[lo, hi]`; **`hi` is inclusive** (as Optuna's `IntDistribution`)."""
    return RandInt(lo, hi)


def _to_domain(name: str, value: Any) -> Domain:
    if isinstance(value, Domain):
        return value
    if isinstance(value, list):
        if not value:
            raise ValueError(f"`space[{name!r}]` is [], but a categorical list must hold at least one value")
        return Categorical(tuple(value))
    return Constant(value)


class SearchSpace:
    """A validated search space (see the module docstring for what a space dict may hold).

    Configs keep the space's key order; sampling draws the parameters in that order from one generator.
    """

    def __init__(self, space: dict[str, Any] | SearchSpace) -> None:
        if isinstance(space, SearchSpace):
            space = space.raw
        if not isinstance(space, dict) or not space:
            raise ValueError(f"`space` is {space!r}, but must be a non-empty dict of name -> domain")
        for name in space:
            if not isinstance(name, str):
                raise TypeError(f"`space` has the key {name!r}, but every key must be a str")
        self.raw = dict(space)
        self.domains: dict[str, Domain] = {name: _to_domain(name, v) for name, v in space.items()}

    def __repr__(self) -> str:
        return f"SearchSpace({self.raw!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SearchSpace) and self.domains == other.domains

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        """One config drawn from the space."""
        return {name: d.sample(rng) for name, d in self.domains.items()}

    def contains(self, config: dict[str, Any]) -> bool:
        """Whether `config` has exactly the space's keys and every value lies in its domain."""
        return set(config) == set(self.domains) and all(d.contains(config[n]) for n, d in self.domains.items())

    def to_optuna(self) -> dict[str, BaseDistribution]:
        """Optuna distributions of the searched (non-constant) parameters."""
        return {n: d.to_optuna() for n, d in self.domains.items() if not isinstance(d, Constant)}

    def to_optuna_params(self, config: dict[str, Any]) -> dict[str, Any]:
        """An Optuna trial's `params` for a config of the space (the inverse of `from_optuna`): the searched
        parameters, choices Optuna cannot store encoded by their index."""
        params: dict[str, Any] = {}
        for name, d in self.domains.items():
            if isinstance(d, Constant):
                continue
            params[name] = d.index(config[name]) if isinstance(d, Categorical) and not d.optuna_native else config[name]
        return params

    def from_optuna(self, params: dict[str, Any]) -> dict[str, Any]:
        """The config for an Optuna trial's `params` (decodes index-encoded choices, adds the constants)."""
        config: dict[str, Any] = {}
        for name, d in self.domains.items():
            if isinstance(d, Constant):
                config[name] = d.value
            elif isinstance(d, Categorical) and not d.optuna_native:
                config[name] = d.choices[params[name]]
            elif isinstance(d, RandInt):
                config[name] = int(params[name])
            else:
                config[name] = params[name]
        return config
