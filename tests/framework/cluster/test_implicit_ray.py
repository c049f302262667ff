"""Ray's implicit start goes through the engine's once `framework` is imported, whichever of the two is imported
first, and importing starts nothing (tests/integration/test_own_ray.py runs it beside a foreign cluster)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CHECK = ("import sys; from framework.cluster.implicit_ray import HOOKED, _start; "
         "print(sorted(m for m in HOOKED if sys.modules[m].auto_init_ray is not _start), ray.is_initialized())")


@pytest.mark.parametrize("imports", ["import framework, ray", "import ray, framework"])
def test_implicit_ray_replaces_each_of_rays_implicit_starts_whichever_is_imported_first(imports):
    done = subprocess.run([sys.executable, "-c", f"{imports}; {CHECK}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[] False"
