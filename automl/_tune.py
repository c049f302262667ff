"""Ray Tune's search-space objects in a space: converted to ours with the same meaning, or refused in one line.

A Ray Tune user's space (`tune.loguniform(1e-4, 1e-1)`, `tune.choice([...])`, `{"grid_search": [...]}`, ...) is
not a constant here: every procedure's space (`automl.SearchSpace`, `GridSearch`, PBT's `hyperparam_mutations`,
PB2's `hyperparam_bounds`) passes through `convert`, which replaces each Tune domain (at any depth of nested dicts)
by the domain of `automl.space` that draws the same values, or raises a `ValueError`/`TypeError` naming the key and
saying what to write instead (before Ray starts, when the procedure is constructed). A Tune object is recognised by
its class's module (`ray.tune...`), so nothing here imports Ray: a space without Tune objects costs no import.

Which Tune domain becomes what (Tune's bounds are kept; `randint`'s and `lograndint`'s exclusive `upper` becomes our
inclusive `hi = upper - 1`, as do `qrandint`'s and `qlograndint`'s for `q == 1`, where Tune's is exclusive too):

    tune.uniform(lo, hi)             uniform(lo, hi)
    tune.quniform(lo, hi, q)         quniform(lo, hi, q)        (each multiple equally likely; Tune's end ones half)
    tune.loguniform(lo, hi)          loguniform(lo, hi)
    tune.qloguniform(lo, hi, q)      qloguniform(lo, hi, q)
    tune.randn(mean, sd)             randn(mean, sd)
    tune.qrandn(mean, sd, q)         qrandn(mean, sd, q)
    tune.randint(lo, hi)             randint(lo, hi - 1)
    tune.qrandint(lo, hi, q)         qrandint(lo, hi, q)        (q == 1: randint(lo, hi - 1))
    tune.lograndint(lo, hi)          lograndint(lo, hi - 1)
    tune.qlograndint(lo, hi, q)      qlograndint(lo, hi, q)     (q == 1: lograndint(lo, hi - 1))
    tune.choice([...])               choice([...]), a list
    tune.sample_from(fn)             sample_from(fn)            (fn(config); it must pickle: a module-level function)
    {"grid_search": [...]}           GridSearch's axis [...]; refused by every other procedure (they draw)

Refused: a `sample_from` whose function takes no argument (it draws a value of its own, unseeded: write a domain)
or does not pickle (a lambda), a grid outside `GridSearch`'s top level, a Tune domain inside a list or tuple (a list
is a choice of values here), and any other `ray.tune` object.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Mapping
from typing import Any

from automl._checks import json_exact, show

#: where Ray Tune's domains live (read from `sys.modules`: a Tune object exists only when it was imported)
_SAMPLE = "ray.tune.search.sample"


def is_tune(value: Any) -> bool:
    """Whether `value` is an object of Ray Tune's (its class is defined in a `ray.tune` module)."""
    module = getattr(type(value), "__module__", "") or ""
    return module == "ray.tune" or module.startswith("ray.tune.")


def is_grid_search(value: Any) -> bool:
    """Whether `value` is Tune's `tune.grid_search(values)`: the dict `{"grid_search": values}`."""
    return isinstance(value, dict) and len(value) == 1 and "grid_search" in value


def holds_tune(value: Any) -> bool:
    """Whether `value` is, or holds at any depth of its dicts, lists and tuples, a Tune object or a grid."""
    if is_tune(value) or is_grid_search(value):
        return True
    if isinstance(value, dict):
        return any(holds_tune(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_tune(v) for v in value)
    return False


def convert(label: str, value: Any, make: Mapping[str, Callable[..., Any]], grid: bool = False) -> Any:
    """`value` (a space, or one entry of it named `label`, e.g. "space['lr']") with every Tune domain replaced by
    ours, dicts rebuilt, anything else as it was. `make` maps the names of our domains ("uniform", "choice",
    "sample_from", ...: `automl.space`'s functions) to what builds them. `grid`: `value` is a `GridSearch` space,
    whose top-level grids (`{"grid_search": [...]}`, `tune.choice(...).grid()`) become lists (the grid's axes).

    Raises:
        ValueError, TypeError: naming the key, for a Tune object with no domain of ours (see the module docstring).
    """
    if not holds_tune(value):
        return value
    if isinstance(value, dict) and not is_grid_search(value):
        return {k: _entry(f"{label}[{k!r}]", v, make, grid, grid) for k, v in value.items()}
    return _entry(label, value, make, False, grid)


def _entry(label: str, value: Any, make: Mapping[str, Callable[..., Any]], grid: bool, in_grid: bool = False) -> Any:
    """`value` converted; `grid`: it is a top-level entry of a `GridSearch` space, `in_grid`: it is in one."""
    if not holds_tune(value):
        return value
    if is_grid_search(value):
        return _grid(label, value["grid_search"], make, grid, in_grid)
    if isinstance(value, dict):
        return {k: _entry(f"{label}[{k!r}]", v, make, False, in_grid) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        i, inner = next((i, v) for i, v in enumerate(value) if holds_tune(v))
        raise ValueError(f"`{label}[{i}]` is {_describe(inner)} inside a list, but a list here is a choice among "
                         "values: write the choice itself (automl.choice([...]) or a list of plain values) or the "
                         "domain itself (automl.uniform(...), ...)")
    converted = domain(label, value, make, grid)
    if grid and not isinstance(converted, list) and type(converted).__name__ not in ("Categorical", "SampleFrom"):
        raise ValueError(f"`{label}` is {_describe(value)}, but a grid needs a list of values (GridSearch draws "
                         "nothing): write tune.grid_search([...]) or a list, or use RandomSearch")
    return converted


def _grid(label: str, values: Any, make: Mapping[str, Callable[..., Any]], grid: bool,
          in_grid: bool = False) -> list[Any]:
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"`{label}` is Ray Tune's grid_search({show(values)}), but a grid needs a non-empty list of "
                         "values")
    if holds_tune(values):
        _entry(label, list(values), make, False)  # raises, naming the Tune object in the list
    if not grid and in_grid:
        raise ValueError(f"`{label}` is Ray Tune's grid_search({show(list(values))}), but GridSearch grids over the "
                         "top-level entries of its space only")
    if not grid:
        raise ValueError(f"`{label}` is Ray Tune's grid_search({show(list(values))}), but only automl.GridSearch "
                         "grids (it draws nothing; a grid at the top level of its space); this procedure draws its "
                         f"configs: write the list {show(list(values))} for a random choice among the values, or use "
                         "GridSearch")
    return [json_exact(f"{label}[{i}]", v) for i, v in enumerate(values)]


def _describe(value: Any) -> str:
    """A Tune object as its user wrote it: `Ray Tune's tune.loguniform(0.0001, 0.1)`."""
    sample = sys.modules.get(_SAMPLE)
    if sample is None or not isinstance(value, sample.Domain):
        return f"a {type(value).__module__}.{type(value).__qualname__} object of Ray Tune"
    sampler, q = _sampler(sample, value)
    log = isinstance(sampler, sample.LogUniform)
    if isinstance(value, sample.Function):
        return f"Ray Tune's tune.sample_from({getattr(value.func, '__qualname__', show(value.func))})"
    if isinstance(value, sample.Categorical):
        return f"Ray Tune's tune.choice({show(list(value.categories))})"
    if isinstance(value, sample.Float) and isinstance(sampler, sample.Normal):
        args = [sampler.mean, sampler.sd]
        name = "randn"
    else:
        args = [value.lower, value.upper]
        name = ("log" if log else "") + ("randint" if isinstance(value, sample.Integer) else "uniform")
    if q is not None:
        name, args = "q" + name, [*args, q]
    return f"Ray Tune's tune.{name}({', '.join(show(a) for a in args)})"


def _sampler(sample: Any, value: Any) -> tuple[Any, Any]:
    """A Tune domain's sampler, and its `q` when it is quantised (else None)."""
    sampler = value.get_sampler()
    if isinstance(sampler, sample.Quantized):
        return sampler.get_sampler(), sampler.q
    return sampler, None


def domain(label: str, value: Any, make: Mapping[str, Callable[..., Any]], grid: bool = False) -> Any:
    """Our domain for the Tune object `value` (at `label`), built by `make` (see `convert`), or a one-line error
    saying what to write instead. With `grid`, a `tune.choice(...).grid()` is a list (a `GridSearch` axis)."""
    sample = sys.modules.get(_SAMPLE)
    what = _describe(value)
    if sample is None or not isinstance(value, sample.Domain):
        raise TypeError(f"`{label}` is {what}, which is no search-space domain: write a domain of automl "
                        "(automl.uniform, loguniform, randint, choice, ...) or a value")
    sampler, q = _sampler(sample, value)
    if isinstance(value, sample.Function):
        return _sample_from(label, what, value, q, make)
    if isinstance(value, sample.Categorical):
        if q is not None:
            raise ValueError(f"`{label}` is {what}, but a choice cannot be quantised: write automl.choice([...])")
        if isinstance(sampler, sample.Grid):
            return _grid(label, list(value.categories), make, grid, grid)
        options = [_entry(f"{label}[{i}]", c, make, False) for i, c in enumerate(value.categories)]
        try:
            return make["choice"](options)
        except (TypeError, ValueError) as e:
            raise type(e)(f"`{label}` is {what}: {e}") from None
    try:
        if isinstance(value, sample.Float):
            lo, hi = value.lower, value.upper
            if isinstance(sampler, sample.Normal):
                if lo not in (None, float("-inf")) or hi not in (None, float("inf")):
                    raise ValueError("a normal draw has no bounds here (Tune refuses them too): write randn or "
                                     "qrandn without bounds, or uniform")
                mean, sd = sampler.mean, sampler.sd
                return make["randn"](mean, sd) if q is None else make["qrandn"](mean, sd, q)
            if isinstance(sampler, sample.LogUniform):
                return make["loguniform"](lo, hi) if q is None else make["qloguniform"](lo, hi, q)
            if isinstance(sampler, sample.Uniform):
                return make["uniform"](lo, hi) if q is None else make["quniform"](lo, hi, q)
        if isinstance(value, sample.Integer):
            log = isinstance(sampler, sample.LogUniform)
            if isinstance(sampler, (sample.Uniform, sample.LogUniform)):
                if q is None or q == 1:  # Tune's `upper` is exclusive here (a quantised one's too, for q == 1)
                    return make["lograndint" if log else "randint"](value.lower, value.upper - 1)
                return make["qlograndint" if log else "qrandint"](value.lower, value.upper, q)
    except (TypeError, ValueError) as e:
        raise type(e)(f"`{label}` is {what}: {e}") from None
    raise ValueError(f"`{label}` is {what} with the sampler {type(sampler).__name__}, which has no domain here: write "
                     "a domain of automl (automl.uniform, loguniform, randint, choice, ...)")


def _sample_from(label: str, what: str, value: Any, q: Any, make: Mapping[str, Callable[..., Any]]) -> Any:
    if q is not None:
        raise ValueError(f"`{label}` is {what}, but a computed value cannot be quantised: write "
                         "automl.sample_from(fn)")
    if not value.pass_config:
        raise ValueError(f"`{label}` is {what}, a function of no argument: it draws a value of its own, which no seed "
                         "repeats; write a domain (automl.uniform, randint, choice, ...), or automl.sample_from(fn) "
                         "with fn(config) computing the value from the config")
    try:
        pickle.dumps(value.func)
    except Exception:  # noqa: BLE001 (what pickle raises varies: PicklingError, AttributeError, TypeError)
        raise TypeError(f"`{label}` is {what}, but its function must pickle (procedures are saved with the run): "
                        "write automl.sample_from(fn) with fn(config) a module-level function (not a lambda or a "
                        "nested function)") from None
    return make["sample_from"](value.func)
