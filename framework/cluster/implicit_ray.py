"""Ray's implicit start is the engine's: once `framework` is imported, a Ray call made before any `ray.init` (Ray
Data's readers, `ray.put`, a remote call) starts Ray through `framework.cluster.ray_start.ensure_ray`.

Ray's own implicit start is a plain `ray.init()`: it attaches to the cluster `ray start` last started on this machine
(another user's, named in Ray's `ray_current_cluster` file), or starts a local Ray with its dashboard and records
nothing for `modelhopper cleanup`. Through `ensure_ray` it gets the run's own local Ray (no dashboard, its
processes recorded), or the cluster `$RAY_ADDRESS` names. `RAY_ENABLE_AUTO_CONNECT=0` still turns it off.

No Ray import here: `install()` runs when `framework` is imported, which stays cheap and Ray-free. It replaces Ray's
`auto_init_ray` at once when Ray is imported already, else right after Ray's package is imported.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
from typing import Any

__all__ = ["install"]

#: the modules of Ray (2.x) that hold its implicit start, `auto_init_ray` (the last two import it by name)
HOOKED = ("ray._private.auto_init_hook", "ray._private.client_mode_hook", "ray.util.placement_group")


def _start() -> None:
    from framework.cluster.ray_start import start_implicitly

    start_implicitly()


def _patch() -> None:
    for name in HOOKED:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "auto_init_ray"):
            module.auto_init_ray = _start


class _AfterRayImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands back the spec of the `ray` package, whose loader patches Ray once Ray's
    `__init__` has run (it imports every module of `HOOKED`). Leaves `sys.meta_path` when it is asked for `ray`."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "ray":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Route Ray's implicit start through `ensure_ray` in this process (idempotent)."""
    if "ray" in sys.modules:
        _patch()
    elif not any(isinstance(f, _AfterRayImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterRayImport())
