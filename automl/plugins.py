"""Finding a procedure by name: the three ways a custom procedure plugs in.

1. an object: `ModelSelection(procedure=MyProcedure(...))` (passed through `load_procedure` unchanged);
2. a "module:Class" string, e.g. `load_procedure("my_pkg.search:MySearch", epochs=3)` (also what experiment
   scripts accept on their command line);
3. a short name registered in the entry point group `modelhopper.procedures`, e.g. in a package's pyproject.toml:

       [project.entry-points."modelhopper.procedures"]
       mysearch = "my_pkg.search:MySearch"

The built-in procedures (grid, random, hyperband, asha, tpe, optuna, pbt, pb2, bohb) are always available by short
name, even when this package is not installed (its own entry points then are not visible).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from typing import Any

from automl._base import Procedure

GROUP = "modelhopper.procedures"

BUILTINS = {
    "grid": "automl.grid:GridSearch",
    "random": "automl.random_search:RandomSearch",
    "hyperband": "automl.hyperband:HyperBand",
    "asha": "automl.asha:ASHA",
    "tpe": "automl.tpe:TPE",
    "optuna": "automl.optuna_search:OptunaSearch",
    "pbt": "automl.pbt:PBT",
    "pb2": "automl.pb2:PB2",
    "bohb": "automl.bohb:BOHB",
}


def available_procedures() -> dict[str, str]:
    """Short name -> "module:Class" of every registered procedure (built-ins, then entry points, which win)."""
    found = dict(BUILTINS)
    for ep in importlib.metadata.entry_points(group=GROUP):
        found[ep.name] = ep.value
    return dict(sorted(found.items()))


def _import(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"`spec` is {target!r}, but a path must read 'module:Class'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"`spec` is {target!r}, but module {module_name!r} cannot be imported: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"`spec` is {target!r}, but module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_procedure(spec: Procedure | type[Procedure] | str, **kwargs: Any) -> Procedure:
    """A procedure from an instance (returned as is; no `kwargs` allowed), a `Procedure` subclass, a
    "module:Class" string or a registered short name; classes are constructed with `kwargs`.

    Raises ValueError for an unknown name (listing the available ones) or a path that does not import, TypeError
    for an object that is not a procedure or a keyword option the class does not take (listing the ones it does).
    """
    if isinstance(spec, Procedure):
        if kwargs:
            raise TypeError(f"`spec` is a procedure instance, but options {sorted(kwargs)} were given as well")
        return spec
    if isinstance(spec, str):
        if ":" in spec:
            cls = _import(spec)
        else:
            names = available_procedures()
            if spec not in names:
                raise ValueError(f"`spec` is {spec!r}, but must be one of {sorted(names)} or a 'module:Class' path")
            cls = _import(names[spec])
    else:
        cls = spec
    if not (inspect.isclass(cls) and issubclass(cls, Procedure)):
        raise TypeError(f"`spec` is {spec!r}, which names {cls!r}, but must name a subclass of automl.Procedure")
    params = inspect.signature(cls).parameters
    known = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise TypeError(f"{cls.__name__} got unknown option(s) {unknown}; its options are {known}")
    required = [n for n in known if params[n].default is inspect.Parameter.empty and n not in kwargs]
    if required:
        raise TypeError(f"{cls.__name__} needs the option(s) {required}, which were not given; pass an instance "
                        f"(e.g. {cls.__name__}({', '.join(f'{n}=...' for n in required)})) or the options")
    return cls(**kwargs)
