"""Search spaces: what a procedure may suggest for each hyper-parameter.

A space is a dict of name -> domain:

* a `list` is a categorical choice among its entries (values a config can hold: see below);
* `uniform(lo, hi)`, `loguniform(lo, hi)` are floats in `[lo, hi]` (log-uniform needs `0 < lo`);
* `choice(options)` is the same categorical choice as the list `options` (Ray Tune's `tune.choice`);
* `randint(lo, hi)` is an int in `[lo, hi]`, **both ends inclusive** (as Optuna's `IntDistribution`), and
  `lograndint(lo, hi)` one whose logarithm is about uniform (`0 < lo`);
* `quniform(lo, hi, q)`, `qloguniform(lo, hi, q)` are floats and `qrandint(lo, hi, q)`, `qlograndint(lo, hi, q)`
  ints: the multiples of `q` in `[lo, hi]` (both ends inclusive; at least one multiple must lie there);
* `randn(mean, sd)` is a normally distributed float, `qrandn(mean, sd, q)` one rounded to a multiple of `q`; they are
  unbounded (any finite real, resp. any finite multiple of `q`, lies in them);
* `sample_from(fn)` is a value computed from the rest of the config, `fn(config)`, after every other parameter was
  drawn (in key order; Ray Tune's `tune.sample_from`, which passes `spec` where this passes the config dict);
* a `dict` that holds a domain (at any depth) is a nested space: the config holds a dict there, drawn by the same
  rules; its parameters are named `"outer/inner"` (Optuna's parameter names, `SearchSpace.domains`);
* anything else (a number, a string, a tuple, a dict without domains, ...) is a constant copied into every config.

**What a config holds** (`automl.json_exact`, one rule for every procedure, a person's `add_config` and the run's
catalog): JSON values that read back as they were, so `model_fn` gets the same config in a run, on its resume and
on its replay: None, bool, int in int64's range, finite float, UTF-8 str, and lists and dicts (str keys) of them.
numpy numbers, 0-d numpy arrays and 0-d torch tensors become the Python number they equal (`np.float32(0.05)` is
the float 0.05000000074505806), tuples become lists; anything else (a set, bytes, a datetime, an object, a tensor
or array with a dimension, nan, 10**400) is refused with one line naming the parameter and the value's type: a
choice or constant when the space is built, a `sample_from` value when it is computed (at the draw, before the
config is recorded anywhere).

Every numeric argument is checked when the domain is built: finite floats (`uniform(0, 10**400)` is refused, as is
a range whose width overflows), ints in int64's range (`randint(0, 2**70)`), and a quantised range whose multiples
of `q` are distinct floats (`quniform(0, 1, 1e-300)` is refused: at most `MAX_MULTIPLE` multiples on either side of
0).

The names are Ray Tune's (`tune.quniform`, `tune.qloguniform`, `tune.qrandint`, `tune.lograndint`, `tune.randn`,
`tune.qrandn`, `tune.choice`, `tune.sample_from`); unlike Tune, a plain list is a choice here (Tune's `tune.choice`),
`randint`'s and `lograndint`'s `hi` is inclusive, and `quniform` draws each multiple of `q` with the same probability
(Optuna's `step`), where Tune rounds a uniform draw (the two end multiples then come half as often). Ray Tune's own
objects (`tune.loguniform(1e-4, 1e-1)`, `{"grid_search": [...]}`, ...) written in a space are converted to these
when the space is built, or refused in one line naming the key (`automl._tune` has the table).

`SearchSpace(space)` validates the dict once and then samples configs with a `numpy.random.Generator`, converts
to Optuna distributions (and back), checks membership, and clips values into the space (PBT's perturbations).
Optuna has no normal distribution: `to_optuna` raises for `randn` and `qrandn`; `qloguniform` (Optuna cannot combine
`log=True` with `step`) becomes a categorical of its multiples when there are at most `MAX_OPTUNA_CHOICES` of them.
`GridSearch` grids over lists only and rejects the other random domains (it draws nothing); `sample_from` is
computed at every grid point.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from automl import _tune
from automl._checks import MAX_INT, MIN_INT, finite_real, json_exact, show

# Optuna stores only these as categorical choices; other choices are encoded by their index.
_OPTUNA_CHOICE_TYPES = (type(None), bool, int, float, str)

#: the most multiples a `qloguniform` may have for Optuna, which searches it as a categorical of its multiples
MAX_OPTUNA_CHOICES = 1000


#: the most multiples of `q` on either side of 0 a quantised float domain may reach: beyond 2**53 neighbouring
#: multiples k * q and (k + 1) * q are the same float
MAX_MULTIPLE = 2**53


def _check_real(name: str, value: Any) -> float:
    """`value` as a Python number (an int stays an int), when it is a real number that is finite as a float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"`{name}` is {show(value)}, but must be a finite real number")
    if finite_real(value) is None:
        raise ValueError(f"`{name}` is {show(value)}, but must be a finite real number (a float64: nan, inf and "
                         "numbers beyond about 1.8e308 are not)")
    return int(value) if isinstance(value, (int, np.integer)) else float(value)


def _check_int(name: str, value: Any) -> int:
    """`value` as a Python int in int64's range (numpy draws int64s, and a config holds an int64)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` is {show(value)}, but must be an int")
    if not MIN_INT <= value <= MAX_INT:
        raise ValueError(f"`{name}` is {show(value)}, but must be an int in [-2**63, 2**63 - 1] (numpy draws int64s, "
                         "and a config holds an int64)")
    return int(value)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _dec(x: float) -> Decimal:
    """`x` as the decimal it is written as (`0.2`, not the binary fraction nearest to it), as Optuna's `step`
    arithmetic, so that the multiples of 0.2 in [3.2, 5.4] are 3.2, 3.4, ..., 5.4 exactly."""
    return Decimal(int(x)) if isinstance(x, (int, np.integer)) else Decimal(repr(float(x)))


def _multiple(k: int, q: float) -> float:
    """`k * q` as the float nearest to the exact decimal product (so 27 * 0.2 is 5.4, not 5.4000000000000004)."""
    return float(k * _dec(q))


def _nearest_k(value: float, q: float) -> int:
    """The `k` of the multiple `k * q` nearest to `value` (ties to even)."""
    return int((_dec(value) / _dec(q)).to_integral_value(ROUND_HALF_EVEN))


def _on_grid(value: Any, q: float) -> bool:
    """Whether `value` is a finite real number within rounding error of a multiple of `q`."""
    if not _is_real(value) or finite_real(value) is None:
        return False
    return math.isclose(value, _multiple(_nearest_k(value, q), q), rel_tol=1e-9, abs_tol=1e-9 * q)


def _check_q(lo: float, hi: float, q: float, max_k: int = MAX_MULTIPLE) -> tuple[int, int]:
    """`(kmin, kmax)`: the multiples of `q` in `[lo, hi]` are `k * q` for `kmin <= k <= kmax` (at least one, and
    `|k| <= max_k`)."""
    _check_real("q", q)
    if not q > 0:
        raise ValueError(f"`q` is {q!r}, but must be > 0")
    kmin = math.ceil(_dec(lo) / _dec(q))
    kmax = math.floor(_dec(hi) / _dec(q))
    if kmin > kmax:
        raise ValueError(f"`q` is {q!r}, but no multiple of it lies in [`lo`, `hi`] = [{lo!r}, {hi!r}]; "
                         "at least one must")
    if max(-kmin, kmax) > max_k:
        raise ValueError(f"`q` is {q!r}, but [`lo`, `hi`] = [{lo!r}, {hi!r}] reaches its multiple k * q for k = "
                         f"{show(kmax if kmax > -kmin else kmin)}, and |k| must be <= {_power(max_k)} (beyond, "
                         "neighbouring multiples are the same number): use a larger `q`")
    return kmin, kmax


def _power(k: int) -> str:
    return {MAX_MULTIPLE: "2**53", MAX_INT: "2**63 - 1"}.get(k, str(k))


class Domain:
    """A range of values for one hyper-parameter (the base of `Uniform`, `LogUniform`, `RandInt`, `LogRandInt`,
    `Categorical`, `Constant`, the quantised `QUniform`, `QLogUniform`, `QRandInt`, `QLogRandInt`, the normal
    `Normal`, `QNormal`, and `SampleFrom`)."""

    def _check_fields(self, check: Callable[[str, Any], Any], *names: str) -> None:
        """Each field of `names` checked by `check(name, value)` (at construction) and held as what it returns
        (a Python number: numpy's are converted)."""
        for name in names:
            object.__setattr__(self, name, check(name, getattr(self, name)))

    def sample(self, rng: np.random.Generator) -> Any:
        """One value drawn from the domain.

        Args:
            rng: The generator every draw comes from, so the same seed gives the same value.

        Returns:
            A value for which `contains` is true: a `float` for `Uniform`, `LogUniform`, `Normal` and their
            quantised forms, an `int` for `RandInt` and `QRandInt`, one of the choices for `Categorical`, the value
            itself for `Constant`.
        """
        raise NotImplementedError

    def contains(self, value: Any) -> bool:
        """Whether `value` lies in the domain.

        Numeric domains accept real numbers (ints and floats, not bools; `RandInt` only ints) within `[lo, hi]`, both
        ends inclusive; quantised ones only multiples of `q` (within rounding error for floats); `Normal` any finite
        real. `Categorical` and `Constant` accept a value equal to a choice and of exactly its type, so `1` is not
        in `[1.0, 2.0]` and `True` is not in `[1, 2]`. `SampleFrom` accepts any value (it is computed, not drawn).
        """
        raise NotImplementedError

    def clip(self, value: Any) -> Any:
        """The value of the domain nearest to `value` (numeric domains: quantised ones round to the nearest multiple
        of `q` inside the range); categorical values pass unchanged."""
        return value

    def to_optuna(self) -> BaseDistribution:
        """The Optuna distribution of the domain, for Optuna's ask-and-tell interface.

        `Uniform` gives a `FloatDistribution`, `LogUniform` one with `log=True`, `RandInt` an `IntDistribution`
        over the same inclusive `[lo, hi]`, and `Categorical` a `CategoricalDistribution` of its choices, or of
        their indices when Optuna cannot store them (see `Categorical.optuna_native`).

        The quantised `QUniform` and `QRandInt` give a distribution with `step=q` over their multiples;
        `QLogUniform` a `CategoricalDistribution` of its multiples (Optuna cannot combine `log=True` with `step`).

        Raises:
            NotImplementedError: For `Constant` and `SampleFrom`, which are not searched; `SearchSpace.to_optuna`
                leaves them out.
            ValueError: For `Normal` and `QNormal` (Optuna has no normal distribution) and for a `QLogUniform` with
                more than `MAX_OPTUNA_CHOICES` multiples.
        """
        raise NotImplementedError

    def to_optuna_value(self, value: Any) -> Any:
        """`value` (in the domain) as a parameter of the distribution `to_optuna` gives (the inverse of
        `from_optuna_value`)."""
        return value

    def from_optuna_value(self, value: Any) -> Any:
        """The config value for a parameter value Optuna suggested from `to_optuna`'s distribution."""
        return value


@dataclass(frozen=True)
class Uniform(Domain):
    """A float drawn uniformly from `[lo, hi]`."""

    lo: float
    hi: float

    def __post_init__(self) -> None:
        self._check_fields(_check_real, "lo", "hi")
        if not self.lo < self.hi:
            raise ValueError(f"`lo` is {self.lo!r}, but must be < `hi` ({self.hi!r})")
        if not math.isfinite(float(self.hi) - float(self.lo)):
            raise ValueError(f"`hi` is {self.hi!r} and `lo` {self.lo!r}, but `hi` - `lo` must be a finite float (a "
                             "draw is lo + (hi - lo) * u)")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.lo, self.hi))

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.lo <= value <= self.hi

    def clip(self, value: Any) -> float:
        return float(min(max(value, self.lo), self.hi))

    def to_optuna(self) -> FloatDistribution:
        return FloatDistribution(float(self.lo), float(self.hi))


def _check_log_lo(lo: float) -> None:
    if not lo > 0:
        raise ValueError(f"`lo` is {lo!r}, but must be > 0 for a log-uniform domain")


def _log_step_choices(ks: tuple[int, int], q: Any, name: str, value: Callable[[int], Any]) -> CategoricalDistribution:
    """Optuna's form of a log domain with a step (`name`: qloguniform or qlograndint), whose multiples of `q` are
    k * q for k in `ks`: a categorical of them (Optuna cannot combine log=True with a step), at most
    `MAX_OPTUNA_CHOICES`."""
    kmin, kmax = ks
    if kmax - kmin + 1 > MAX_OPTUNA_CHOICES:
        raise ValueError(f"it has {kmax - kmin + 1} multiples of `q` ({q!r}) and Optuna, which cannot combine "
                         f"log=True with a step, searches a {name} as a categorical of at most {MAX_OPTUNA_CHOICES} "
                         f"multiples: use a larger `q`, or {name[1:]}")
    return CategoricalDistribution(tuple(value(k) for k in range(kmin, kmax + 1)))


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """A draw whose logarithm is uniform in `[log lo, log hi]` (the caller clips: exp(log) may round outside)."""
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


@dataclass(frozen=True)
class LogUniform(Uniform):
    """A float whose logarithm is drawn uniformly from `[log lo, log hi]` (`0 < lo < hi`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_log_lo(self.lo)

    def sample(self, rng: np.random.Generator) -> float:
        # exp(log) can land a rounding error outside the ends; clip keeps the value inside.
        return self.clip(_log_uniform(rng, self.lo, self.hi))

    def to_optuna(self) -> FloatDistribution:
        return FloatDistribution(float(self.lo), float(self.hi), log=True)


@dataclass(frozen=True)
class RandInt(Domain):
    """An int drawn uniformly from `[lo, hi]`, both ends inclusive (as Optuna's `IntDistribution`)."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        self._check_fields(_check_int, "lo", "hi")
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

    def from_optuna_value(self, value: Any) -> int:
        return int(value)


@dataclass(frozen=True)
class Categorical(Domain):
    """One of `choices`, each with the same probability (a list in a space dict)."""

    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        if len(self.choices) == 0:
            raise ValueError("`choices` is [], but must hold at least one value")
        object.__setattr__(self, "choices", tuple(json_exact(f"choices[{i}]", c) for i, c in enumerate(self.choices)))

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

    def to_optuna_value(self, value: Any) -> Any:
        return value if self.optuna_native else self.index(value)

    def from_optuna_value(self, value: Any) -> Any:
        return value if self.optuna_native else self.choices[value]


@dataclass(frozen=True)
class Constant(Domain):
    """A fixed value copied into every config."""

    value: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", json_exact("value", self.value))

    def sample(self, rng: np.random.Generator) -> Any:
        return self.value

    def contains(self, value: Any) -> bool:
        return type(value) is type(self.value) and value == self.value


@dataclass(frozen=True)
class QUniform(Uniform):
    """A multiple of `q` in `[lo, hi]` (both ends inclusive), each with the same probability: a float."""

    q: float

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_fields(_check_real, "q")
        _check_q(self.lo, self.hi, self.q)

    @property
    def ks(self) -> tuple[int, int]:
        """`(kmin, kmax)`: the domain's values are `k * q` for `kmin <= k <= kmax`."""
        return _check_q(self.lo, self.hi, self.q)

    def sample(self, rng: np.random.Generator) -> float:
        kmin, kmax = self.ks
        return _multiple(int(rng.integers(kmin, kmax, endpoint=True)), self.q)

    def contains(self, value: Any) -> bool:
        if not _on_grid(value, self.q):
            return False
        kmin, kmax = self.ks
        return kmin <= _nearest_k(value, self.q) <= kmax

    def clip(self, value: Any) -> float:
        kmin, kmax = self.ks
        return _multiple(min(max(_nearest_k(value, self.q), kmin), kmax), self.q)

    def to_optuna(self) -> FloatDistribution:
        kmin, kmax = self.ks
        return FloatDistribution(_multiple(kmin, self.q), _multiple(kmax, self.q), step=float(self.q))

    def to_optuna_value(self, value: Any) -> float:
        return self.clip(value)

    def from_optuna_value(self, value: Any) -> float:
        return self.clip(value)  # Optuna computes low + k * step in binary: 3.4000000000000004 becomes 3.4


@dataclass(frozen=True)
class QLogUniform(QUniform):
    """A log-uniform draw from `[lo, hi]` (`0 < lo`) rounded to the nearest multiple of `q` in the range: a float.

    For Optuna (which cannot combine `log=True` with `step`) it is a `CategoricalDistribution` of its multiples, if
    there are at most `MAX_OPTUNA_CHOICES`.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_log_lo(self.lo)

    def sample(self, rng: np.random.Generator) -> float:
        return self.clip(_log_uniform(rng, self.lo, self.hi))

    def to_optuna(self) -> CategoricalDistribution:
        return _log_step_choices(self.ks, self.q, "qloguniform", lambda k: _multiple(k, self.q))


@dataclass(frozen=True)
class QRandInt(RandInt):
    """An int multiple of `q` in `[lo, hi]`, both ends inclusive, each with the same probability."""

    q: int

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_fields(_check_int, "q")
        _check_q(self.lo, self.hi, self.q, MAX_INT)

    @property
    def ks(self) -> tuple[int, int]:
        """`(kmin, kmax)`: the domain's values are `k * q` for `kmin <= k <= kmax`."""
        return -(-int(self.lo) // int(self.q)), int(self.hi) // int(self.q)

    def sample(self, rng: np.random.Generator) -> int:
        kmin, kmax = self.ks
        return int(rng.integers(kmin, kmax, endpoint=True)) * int(self.q)

    def contains(self, value: Any) -> bool:
        return super().contains(value) and value % self.q == 0

    def clip(self, value: Any) -> int:
        kmin, kmax = self.ks
        return min(max(_nearest_k(value, self.q), kmin), kmax) * int(self.q)

    def to_optuna(self) -> IntDistribution:
        kmin, kmax = self.ks
        return IntDistribution(kmin * int(self.q), kmax * int(self.q), step=int(self.q))


def _log_floor(rng: np.random.Generator, lo: int, hi: int) -> int:
    """The floor of a log-uniform draw from `[lo, hi + 1)`, kept in `[lo, hi]` (`0 < lo <= hi`): each int `k` with
    probability log((k + 1) / k) / log((hi + 1) / lo), Ray Tune's `lograndint(lo, hi + 1)`."""
    return min(max(math.floor(_log_uniform(rng, lo, hi + 1)), lo), hi)


@dataclass(frozen=True)
class LogRandInt(RandInt):
    """An int in `[lo, hi]`, both ends inclusive (`0 < lo`), whose logarithm is about uniform: the floor of a
    log-uniform draw from `[lo, hi + 1)` (Ray Tune's `tune.lograndint(lo, hi + 1)`, whose `hi` is exclusive).
    Optuna searches it as `IntDistribution(lo, hi, log=True)`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_log_lo(self.lo)

    def sample(self, rng: np.random.Generator) -> int:
        return _log_floor(rng, int(self.lo), int(self.hi))

    def to_optuna(self) -> IntDistribution:
        return IntDistribution(int(self.lo), int(self.hi), log=True)


@dataclass(frozen=True)
class QLogRandInt(QRandInt):
    """An int multiple `k * q` of `q` in `[lo, hi]`, both ends inclusive (`0 < lo`), whose `k` is drawn as
    `LogRandInt` draws (Ray Tune's `tune.qlograndint(lo, hi, q)` for `q > 1`). Optuna, which cannot combine
    `log=True` with a step, searches it as a categorical of its multiples (at most `MAX_OPTUNA_CHOICES`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_log_lo(self.lo)

    def sample(self, rng: np.random.Generator) -> int:
        kmin, kmax = self.ks
        return _log_floor(rng, kmin, kmax) * int(self.q)

    def to_optuna(self) -> CategoricalDistribution:
        return _log_step_choices(self.ks, self.q, "qlograndint", lambda k: k * int(self.q))


#: how far from its mean (in standard deviations) a normal draw is taken to land at most (beyond 10: p < 1e-23)
_SDS = 10


@dataclass(frozen=True)
class Normal(Domain):
    """A float drawn from the normal distribution of mean `mean` and standard deviation `sd` (unbounded: any finite
    real lies in it). Optuna has no normal distribution: `to_optuna` raises."""

    mean: float
    sd: float

    def __post_init__(self) -> None:
        self._check_fields(_check_real, "mean", "sd")
        if not self.sd > 0:
            raise ValueError(f"`sd` is {self.sd!r}, but must be > 0")
        if not math.isfinite(abs(float(self.mean)) + _SDS * float(self.sd)):
            raise ValueError(f"`sd` is {self.sd!r} and `mean` {self.mean!r}, but `mean` ± {_SDS} `sd` must be finite "
                             "floats (a draw may land there)")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.normal(self.mean, self.sd))

    def contains(self, value: Any) -> bool:
        return _is_real(value) and finite_real(value) is not None

    def clip(self, value: Any) -> float:
        return float(value)

    def to_optuna(self) -> BaseDistribution:
        raise ValueError("Optuna has no normal distribution, so an Optuna-based procedure cannot search randn or "
                         "qrandn: use uniform/quniform over the range you mean, or RandomSearch")


@dataclass(frozen=True)
class QNormal(Normal):
    """A normal draw (`mean`, `sd`) rounded to the nearest multiple of `q` (unbounded: any finite multiple lies in
    it)."""

    q: float

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_fields(_check_real, "q")
        if not self.q > 0:
            raise ValueError(f"`q` is {self.q!r}, but must be > 0")
        reach = abs(float(self.mean)) + _SDS * float(self.sd)
        if _dec(reach) / _dec(self.q) > MAX_MULTIPLE:
            raise ValueError(f"`q` is {self.q!r}, but a draw within `mean` ± {_SDS} `sd` reaches its multiple k * q for "
                             f"|k| up to {show(int(_dec(reach) / _dec(self.q)))}, and |k| must be <= 2**53 (beyond, "
                             "neighbouring multiples are the same number): use a larger `q`")

    def sample(self, rng: np.random.Generator) -> float:
        return self.clip(rng.normal(self.mean, self.sd))

    def contains(self, value: Any) -> bool:
        return _on_grid(value, self.q)

    def clip(self, value: Any) -> float:
        return _multiple(_nearest_k(value, self.q), self.q)


@dataclass(frozen=True)
class SampleFrom(Domain):
    """A value computed from the config: `fn(config)`, called after every other parameter was drawn, in the space's
    key order (a later `sample_from` sees the earlier ones). `config` is the config so far (nested as the space),
    which `fn` must not change. Nothing is searched: any value lies in it, Optuna never sees it, and PBT computes
    it again from the perturbed config."""

    fn: Callable[[dict[str, Any]], Any]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"`fn` is {self.fn!r}, but must be a function fn(config) -> value")
        try:
            pickle.dumps(self.fn)
        except Exception as e:
            raise TypeError(f"`fn` is {self.fn!r}, but must pickle (a module-level function, not a lambda or a nested "
                            f"function): procedures are saved with the run ({type(e).__name__}: {e})") from None

    def sample(self, rng: np.random.Generator) -> Any:
        raise TypeError("a sample_from value is computed from the config: use SearchSpace.sample")

    def contains(self, value: Any) -> bool:
        return True

    def compute(self, config: dict[str, Any]) -> Any:
        """`fn(config)`."""
        return self.fn(config)


def uniform(lo: float, hi: float) -> Uniform:
    """A float drawn uniformly from `[lo, hi]` (`lo < hi`)."""
    return Uniform(lo, hi)


def loguniform(lo: float, hi: float) -> LogUniform:
    """A float drawn log-uniformly from `[lo, hi]` (`0 < lo < hi`), e.g. a learning rate."""
    return LogUniform(lo, hi)


def randint(lo: int, hi: int) -> RandInt:
    """An int drawn uniformly from `[lo, hi]`; **`hi` is inclusive** (as Optuna's `IntDistribution`)."""
    return RandInt(lo, hi)


def lograndint(lo: int, hi: int) -> LogRandInt:
    """An int in `[lo, hi]` (`0 < lo`; **`hi` is inclusive**) whose logarithm is about uniform, e.g. a width or a
    number of trees (Ray Tune's `tune.lograndint`, whose `hi` is exclusive: `tune.lograndint(1, 1000)` is
    `lograndint(1, 999)`)."""
    return LogRandInt(lo, hi)


def choice(options: Any) -> Categorical:
    """One of `options` (a non-empty list or tuple of values a config can hold), each with the same probability:
    the same as writing the list itself in a space (Ray Tune's `tune.choice`). In `GridSearch` it is an axis of the
    grid, as a list is."""
    if isinstance(options, (str, bytes, dict)) or not isinstance(options, (list, tuple)):
        raise TypeError(f"`options` is {show(options)}, but must be a list of values (choice(['sgd', 'adam']))")
    if not options:
        raise ValueError("`options` is [], but must hold at least one value")
    return Categorical(tuple(json_exact(f"options[{i}]", v) for i, v in enumerate(options)))


def quniform(lo: float, hi: float, q: float) -> QUniform:
    """A float multiple of `q > 0` in `[lo, hi]` (both ends inclusive), each equally likely (Ray Tune's
    `tune.quniform`; Optuna's `FloatDistribution(step=q)`). At least one multiple must lie in the range."""
    return QUniform(lo, hi, q)


def qloguniform(lo: float, hi: float, q: float) -> QLogUniform:
    """A log-uniform draw from `[lo, hi]` (`0 < lo < hi`) rounded to the nearest multiple of `q > 0` in the range
    (Ray Tune's `tune.qloguniform`). Optuna searches it as a categorical of its multiples (at most
    `MAX_OPTUNA_CHOICES`)."""
    return QLogUniform(lo, hi, q)


def qrandint(lo: int, hi: int, q: int = 1) -> QRandInt:
    """An int multiple of `q >= 1` in `[lo, hi]`; **`hi` is inclusive** (Ray Tune's `tune.qrandint`; Optuna's
    `IntDistribution(step=q)`). At least one multiple must lie in the range."""
    return QRandInt(lo, hi, q)


def qlograndint(lo: int, hi: int, q: int) -> QLogRandInt:
    """An int multiple of `q >= 1` in `[lo, hi]` (`0 < lo`; **`hi` is inclusive**), drawn log-uniformly among the
    multiples (Ray Tune's `tune.qlograndint` for `q > 1`; Tune's `hi` is exclusive for `q == 1`). Optuna searches it
    as a categorical of its multiples (at most `MAX_OPTUNA_CHOICES`)."""
    return QLogRandInt(lo, hi, q)


def randn(mean: float = 0.0, sd: float = 1.0) -> Normal:
    """A float drawn from the normal distribution (`sd > 0`; Ray Tune's `tune.randn`). Not for Optuna-based
    procedures (Optuna has no normal distribution)."""
    return Normal(mean, sd)


def qrandn(mean: float, sd: float, q: float) -> QNormal:
    """A normal draw rounded to the nearest multiple of `q > 0` (Ray Tune's `tune.qrandn`). Not for Optuna-based
    procedures."""
    return QNormal(mean, sd, q)


def sample_from(fn: Callable[[dict[str, Any]], Any]) -> SampleFrom:
    """A value computed from the config, `fn(config)`, after the other parameters were drawn (Ray Tune's
    `tune.sample_from`, whose `fn` gets `spec` where this one gets the config dict). `fn` must be a module-level
    function (procedures are pickled with the run) and should be deterministic (a value to draw is a domain)."""
    return SampleFrom(fn)


#: what `convert_tune` builds each of Ray Tune's domains with
_MAKE: dict[str, Callable[..., Domain]] = {
    "uniform": uniform, "quniform": quniform, "loguniform": loguniform, "qloguniform": qloguniform, "randn": randn,
    "qrandn": qrandn, "randint": randint, "qrandint": qrandint, "lograndint": lograndint, "qlograndint": qlograndint,
    "choice": choice, "sample_from": sample_from,
}


def convert_tune(label: str, value: Any, grid: bool = False) -> Any:
    """`value` (a space, or what names its hyper-parameters, at `label`) with each of Ray Tune's domains, at any
    depth of its dicts, replaced by ours of the same meaning, or a one-line error naming the key and what to write
    instead (`automl._tune` has the table). `grid`: a `GridSearch` space, whose top-level `tune.grid_search([...])`
    become lists. Imports nothing of Ray: a Tune object is known by its class's module."""
    return _tune.convert(label, value, _MAKE, grid)


def _label(path: tuple[str, ...]) -> str:
    return "space" + "".join(f"[{k!r}]" for k in path)


def _fn_name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


def _is_nested(value: Any) -> bool:
    """Whether `value` is a nested space: a dict holding a domain at some depth (a dict without one is a constant)."""
    return isinstance(value, dict) and any(isinstance(v, Domain) or _is_nested(v) for v in value.values())


def _to_domain(name: str, value: Any) -> Domain:
    if isinstance(value, Domain):
        return value
    if isinstance(value, list):
        if not value:
            raise ValueError(f"`{name}` is [], but a categorical list must hold at least one value")
        return Categorical(tuple(json_exact(f"{name}[{i}]", v) for i, v in enumerate(value)))
    return Constant(json_exact(name, value))


class SearchSpace:
    """A validated search space (see the module docstring for what a space dict may hold).

    `domains` maps every parameter to its domain, in key order, depth first; a parameter of a nested space is named
    by its keys joined with "/" (`"optimizer/lr"`), which is also its Optuna name. `paths` maps the same names to
    their key paths (`("optimizer", "lr")`). Configs keep the space's key order (nested dicts theirs); sampling draws
    the parameters in `domains`' order from one generator, then computes the `sample_from` values in that order.
    """

    def __init__(self, space: dict[str, Any] | SearchSpace) -> None:
        if isinstance(space, SearchSpace):
            space = space.raw
        if not isinstance(space, dict) or not space:
            raise ValueError(f"`space` is {space!r}, but must be a non-empty dict of name -> domain")
        space = convert_tune("space", space)  # Ray Tune's domains become ours (or are refused, naming the key)
        self.raw = dict(space)
        self.domains: dict[str, Domain] = {}
        self.paths: dict[str, tuple[str, ...]] = {}
        self._tree = self._build(space, ())

    def _build(self, space: dict[str, Any], prefix: tuple[str, ...]) -> dict[str, Any]:
        tree: dict[str, Any] = {}
        for key, value in space.items():
            if not isinstance(key, str):
                where = f"`{_label(prefix)}`" if prefix else "`space`"
                raise TypeError(f"{where} has the key {key!r}, but every key must be a str")
            path = (*prefix, key)
            if _is_nested(value):
                tree[key] = self._build(value, path)
                continue
            name = "/".join(path)
            if name in self.domains:
                raise ValueError(f"`{_label(path)}` is named {name!r}, as `{_label(self.paths[name])}` is: the "
                                 "names of a nested space's parameters join its keys with '/' and must be unique")
            self.domains[name] = tree[key] = _to_domain(_label(path), value)
            self.paths[name] = path
        return tree

    def __repr__(self) -> str:
        return f"SearchSpace({self.raw!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SearchSpace) and self._tree == other._tree

    def holds(self, path: tuple[str, ...]) -> bool:
        """Whether the key path `path` (`("optimizer", "lr")`) is a parameter of the space, or a key inside a
        constant dict of it (`{"arch": {"momentum": 0.9}}` holds `("arch", "momentum")`): what every config has."""
        path = tuple(path)
        if self.paths.get("/".join(path)) == path:
            return True
        for i in range(len(path) - 1, 0, -1):
            name = "/".join(path[:i])
            domain = self.domains.get(name)
            if self.paths.get(name) == path[:i] and isinstance(domain, Constant):
                value = domain.value
                for key in path[i:]:
                    if not isinstance(value, dict) or key not in value:
                        return False
                    value = value[key]
                return True
        return False

    def named(self, what: str, value: dict[str, Any]) -> dict[str, tuple[tuple[str, ...], Any]]:
        """The entries of `value`, a dict that names hyper-parameters of the space (PBT's `hyperparam_mutations`,
        PB2's `hyperparam_bounds`, as Ray Tune writes them): flat name -> (key path, entry). A nested dict names
        nested keys (Tune's `{"arch": {"momentum": ...}}`), as does an "outer/inner" key; every other value is an
        entry. Each name must be one the space holds (`holds`): else a `ValueError` naming it (`what[...]`) and the
        names the space has."""
        out: dict[str, tuple[tuple[str, ...], Any]] = {}

        def walk(entries: dict[str, Any], prefix: tuple[str, ...], label: str) -> None:
            if not entries:
                raise ValueError(f"`{label}` is {{}}, but must name at least one hyper-parameter")
            for key, entry in entries.items():
                if not isinstance(key, str):
                    raise TypeError(f"`{label}` has the key {key!r}, but every key must be a str")
                path = self.paths[key] if not prefix and key in self.paths else (*prefix, *key.split("/"))
                if isinstance(entry, dict):
                    walk(entry, path, f"{label}[{key!r}]")
                    continue
                name = "/".join(path)
                if name in out:
                    raise ValueError(f"`{what}` names {name!r} twice (nested and as 'outer/inner'): name it once")
                if not self.holds(path):
                    raise ValueError(f"`{what}[{name!r}]` names {name!r}, but `space` has no such hyper-parameter: it "
                                     f"has {list(self.domains)}; add it to the space (a constant or a domain) or "
                                     "name one it has (a nested one as {'outer': {'inner': ...}} or 'outer/inner')")
                out[name] = (path, entry)

        walk(value, (), what)
        return out

    @property
    def searched(self) -> dict[str, Domain]:
        """The parameters a procedure searches: `domains` without constants and `sample_from` values."""
        return {n: d for n, d in self.domains.items() if not isinstance(d, (Constant, SampleFrom))}

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        """One config drawn from the space."""
        return self.assemble({n: d.sample(rng) for n, d in self.domains.items() if not isinstance(d, SampleFrom)})

    def assemble(self, values: dict[str, Any]) -> dict[str, Any]:
        """The config of the parameter values `values` (flat names, as `domains`): nested as the space, constants
        filled in where `values` lacks them, and every `sample_from` computed, in key order, from the config so far
        (its entry in `values`, if any, is ignored)."""
        partial: dict[str, Any] = {}
        for name, d in self.domains.items():
            if not isinstance(d, SampleFrom):
                value = values[name] if name in values or not isinstance(d, Constant) else d.value
                _put(partial, self.paths[name], json_exact(_label(self.paths[name]), value))
        for name, d in self.domains.items():
            if isinstance(d, SampleFrom):
                value = d.compute(partial)  # (what `fn` itself raises is the user's: it passes as it is)
                try:
                    value = json_exact(_label(self.paths[name]), value)
                except (TypeError, ValueError) as e:
                    raise type(e)(f"{e} (what sample_from({_fn_name(d.fn)}) returned)") from None
                _put(partial, self.paths[name], value)
        return _ordered(self._tree, partial)

    def flatten(self, config: dict[str, Any]) -> dict[str, Any]:
        """The values of `config`'s parameters by flat name (as `domains`); the inverse of `assemble`.

        Raises:
            KeyError: If `config` lacks a parameter of the space.
        """
        out = {}
        for name, path in self.paths.items():
            value = config
            for key in path:
                value = value[key]
            out[name] = value
        return out

    def contains(self, config: dict[str, Any]) -> bool:
        """Whether `config` has exactly the space's keys (nested dicts theirs) and every value lies in its domain
        (a `sample_from` value is not checked: any value lies in it)."""
        if not _same_keys(config, self._tree):
            return False
        values = self.flatten(config)
        return all(d.contains(values[n]) for n, d in self.domains.items())

    def to_optuna(self) -> dict[str, BaseDistribution]:
        """Optuna distributions of the searched parameters (not the constants and `sample_from` values), by flat name.

        Raises:
            ValueError: Naming the parameter, if its domain has no Optuna distribution (`randn`, `qrandn`, a
                `qloguniform` with too many multiples).
        """
        out = {}
        for name, d in self.searched.items():
            try:
                out[name] = d.to_optuna()
            except ValueError as e:
                raise ValueError(f"`{_label(self.paths[name])}` is {d!r}, but {e}") from None
        return out

    def to_optuna_params(self, config: dict[str, Any]) -> dict[str, Any]:
        """An Optuna trial's `params` for a config of the space (the inverse of `from_optuna`): the searched
        parameters by flat name, choices Optuna cannot store encoded by their index."""
        values = self.flatten(config)
        return {name: d.to_optuna_value(values[name]) for name, d in self.searched.items()}

    def from_optuna(self, params: dict[str, Any]) -> dict[str, Any]:
        """The config for an Optuna trial's `params` (decodes index-encoded choices, rounds quantised values to their
        multiple, adds the constants, computes the `sample_from` values)."""
        return self.assemble({name: d.from_optuna_value(params[name]) for name, d in self.searched.items()})


def _put(config: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        config = config.setdefault(key, {})
    config[path[-1]] = value


def _ordered(tree: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """`config` with the keys in the space's order (a `sample_from` value was inserted last)."""
    return {k: _ordered(sub, config[k]) if isinstance(sub, dict) else config[k] for k, sub in tree.items()}


def _same_keys(config: Any, tree: dict[str, Any]) -> bool:
    if not isinstance(config, dict) or set(config) != set(tree):
        return False
    return all(_same_keys(config[k], sub) for k, sub in tree.items() if isinstance(sub, dict))
