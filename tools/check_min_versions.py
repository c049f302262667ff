"""Print the versions `make test-min` runs against and fail when one is not the floor pinned in
tools/constraints-min.txt (a stale .venv-min, or a pin pip could not honour). torch is reported, not enforced: the
Makefile installs $(TORCH_MIN_SPEC), which is the floor only when asked for (see tools/constraints-min.txt).

Usage: python tools/check_min_versions.py [tools/constraints-min.txt]
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

NOT_ENFORCED = {"torch"}


def main(path: str) -> int:
    wrong = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        try:
            have = version(req.name)
        except PackageNotFoundError:
            have = "not installed"
        ok = have != "not installed" and Version(have).release == Version(spec.version).release
        note = "" if ok else ("  (not the floor: TORCH_MIN_SPEC)" if req.name in NOT_ENFORCED else "  <- NOT THE FLOOR")
        print(f"  {req.name:<18} {have:<14} floor {spec.version}{note}")
        if not ok and req.name not in NOT_ENFORCED:
            wrong.append(req.name)
    if wrong:
        print(f"not at their floors: {', '.join(wrong)} (rm -rf the venv and run `make test-min` again)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).with_name("constraints-min.txt"))))
