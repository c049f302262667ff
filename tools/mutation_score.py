"""Mutation testing of the pure packages with mutmut 3, and a score table with one row per package.

    python tools/mutation_score.py                 # every row (`make mutate`)
    python tools/mutation_score.py --pkg automl    # one row (`make mutate PKG=automl`)
    python tools/mutation_score.py --report-only   # the table of the last run, without running anything

The scope is `[tool.mutmut] only_mutate` in pyproject.toml: each entry is one row (a path that does not exist yet
is listed as absent). `[tool.mutation_score] functions` limits a file's row to some of its functions. Which tests
may kill a mutant is `testpaths` in `[tool.mutmut] pytest_add_cli_args`. Each row is one `mutmut run` over the
row's mutants (so its wall time is measured); mutmut keeps its work in mutants/ (sources, per-mutant results,
which test calls which function) and reuses it on the next run. Every mutant that was not killed, with its diff,
goes to mutants/survivors/<row>.txt (or --survivors-dir); `mutmut show NAME` / `mutmut browse` look at one.

Score = (killed + timeout) / mutants: a mutant that makes the tests hang is caught. "no tests" counts as a survivor:
no selected test calls the function at all. mutmut 3 mutates code inside functions only, and skips functions with
decorators other than @staticmethod/@classmethod (so @property ones): the table's footnote lists those in scope.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import glob
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SEP = "ǁ"  # mutmut's separator in method names: module.xǁClassǁmethod__mutmut_3 (functions: module.x_func__mutmut_3)
# mutmut's exit code of a mutant's test run -> how this table counts it (mutmut.stats.status_by_exit_code)
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "killed",
    None: "not checked",
}
COLUMNS = ("killed", "survived", "no tests", "timeout", "suspicious")


@dataclass
class Row:
    entry: str  # the only_mutate glob
    label: str
    files: list[str]
    functions: set[str] | None  # mangled names (x_f / xǁCǁm) the row is limited to, or None for whole files
    skip: set[str]  # mangled names left out
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COLUMNS + ("not checked",), 0))
    not_killed: list[tuple[str, str, str]] = field(default_factory=list)  # (status, mutant name, source path)
    wall_s: float | None = None
    cpu_s: float | None = None

    @property
    def total(self) -> int:
        return sum(self.counts[c] for c in COLUMNS)

    def patterns(self) -> list[str]:
        """`mutmut run` arguments that select exactly the row's mutants."""
        out = []
        for f in self.files:
            module = module_of(f)
            if self.functions is None and not self.skip:
                out += [f"{module}.x_*", f"{module}.x{SEP}*"]
            else:
                out += [f"{module}.{fn}__mutmut_*" for fn in functions_of(f) if self.owns_function(fn)]
        return out

    def owns_function(self, mangled: str) -> bool:
        return (self.functions is None or mangled in self.functions) and mangled not in self.skip

    def owns(self, mutant: str) -> bool:
        return self.owns_function(mutant.partition("__mutmut_")[0].rpartition(".")[2])


def functions_of(path: str) -> list[str]:
    """Mangled names of what mutmut 3 can mutate in a file: top-level functions and methods of top-level classes."""
    tree = ast.parse((ROOT / path).read_text())
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(mangle(node.name))
        elif isinstance(node, ast.ClassDef):
            out += [
                mangle(f"{node.name}.{n.name}")
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
    return out


def module_of(path: str) -> str:
    """framework/scheduling/cpsat.py -> framework.scheduling.cpsat; a package's __init__.py -> the package."""
    module = path[: -len(".py")].replace(os.sep, ".").replace("/", ".")
    return module[: -len(".__init__")] if module.endswith(".__init__") else module


def mangle(qualname: str) -> str:
    """ "Result.leaderboard" -> "xǁResultǁleaderboard"; "solve" -> "x_solve"."""
    cls, _, name = qualname.rpartition(".")
    return f"x{SEP}{cls}{SEP}{name}" if cls else f"x_{name}"


def load_rows() -> list[Row]:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    ignored = tool["mutmut"].get("do_not_mutate", [])
    limits = tool.get("mutation_score", {}).get("functions", {})
    skips = tool.get("mutation_score", {}).get("skip", {})
    rows, seen = [], set()
    for entry in tool["mutmut"]["only_mutate"]:
        files = sorted(
            f
            for f in glob.glob(entry, root_dir=ROOT, recursive=True)
            if f.endswith(".py") and f not in seen and not any(fnmatch.fnmatch(f, p) for p in ignored)
        )
        seen.update(files)
        label = entry.removesuffix("/*").removesuffix("*").removesuffix(".py").rstrip("/")
        functions = None
        if entry in limits:
            functions = {mangle(q) for q in limits[entry]}
            label += " (" + ", ".join(q.rpartition(".")[2] for q in limits[entry]) + ")"
        skip = {mangle(q) for f in files for q in skips.get(f, [])}
        rows.append(Row(entry, label, files, functions, skip))
    return rows


def pick(rows: list[Row], pkg: str) -> list[Row]:
    """A row by its only_mutate entry or label, or a unique part of it (`scheduling`, `policy`, `result`)."""
    for key in (lambda r: pkg in (r.entry, r.label), lambda r: pkg in r.label):
        chosen = [r for r in rows if key(r)]
        if len(chosen) == 1:
            return chosen
    raise SystemExit(f"PKG={pkg!r} names no single row of the scope; rows: {', '.join(r.label for r in rows)}")


def run_row(row: Row, jobs: int) -> int:
    """One `mutmut run` over the row's mutants; its output is shown up to the per-mutant list it ends with."""
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *row.patterns()]
    print(f"\n==== {row.label}: mutmut run over {len(row.files)} file(s)", flush=True)
    start, cpu = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, tail, echo = sys.stdout.buffer, b"", True
    while chunk := proc.stdout.read1(65536):
        if echo:
            tail += chunk
            if (i := tail.find(b"\nMutant results\n")) >= 0:
                out.write(tail[:i] + b"\n")
                echo = False
            else:
                out.write(tail[:-32])
                tail = tail[-32:]
            out.flush()
    out.write(tail if echo else b"")
    rc = proc.wait()
    row.wall_s = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # mutmut and every mutant it forked
    row.cpu_s = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    print(f"==== {row.label}: {row.wall_s:.0f} s wall, {row.cpu_s:.0f} s CPU, mutmut exit code {rc}", flush=True)
    return rc


def collect(rows: list[Row]) -> None:
    for row in rows:
        for f in row.files:
            meta = ROOT / "mutants" / (f + ".meta")
            if not meta.exists():
                continue
            for mutant, code in json.loads(meta.read_text())["exit_code_by_key"].items():
                if not row.owns(mutant):
                    continue
                status = STATUS.get(code, "suspicious")  # segfaults and unknown codes included
                if status == "skipped":
                    continue
                row.counts[status] += 1
                if status not in ("killed", "not checked"):
                    row.not_killed.append((status, mutant, f))


def skipped_functions(row: Row) -> list[str]:
    """Functions of the row that mutmut 3 does not mutate: decorated by anything but staticmethod/classmethod."""
    out = []
    for f in row.files:
        tree = ast.parse((ROOT / f).read_text())
        for cls in [tree, *[n for n in tree.body if isinstance(n, ast.ClassDef)]]:
            prefix = "" if cls is tree else cls.name + "."
            for node in cls.body:
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.decorator_list:
                    continue
                names = {ast.unparse(d) for d in node.decorator_list}
                if len(names) == 1 and names <= {"staticmethod", "classmethod", "abc.abstractmethod", "abstractmethod"}:
                    continue  # mutated, or nothing to mutate
                if row.owns_function(mangle(prefix + node.name)):
                    out.append(f"{prefix}{node.name} ({'/'.join(sorted('@' + n for n in names))})")
    return out


def write_survivors(rows: list[Row], folder: Path) -> None:
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)  # mutmut reads its config and mutants/ from the project root
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant
    except ImportError:  # pragma: no cover - an older or newer mutmut: names only
        get_diff_for_mutant = None
    folder.mkdir(parents=True, exist_ok=True)
    for row in rows:
        if not row.files:
            continue
        slug = re.sub(r"[^A-Za-z0-9]+", "_", row.entry.removesuffix("*").removesuffix(".py")).strip("_")
        lines = [f"# {row.label}: {len(row.not_killed)} of {row.total} mutants not killed", ""]
        for status, mutant, f in sorted(row.not_killed, key=lambda t: (t[0] != "survived", t[1])):
            lines.append(f"## {status}: {mutant}")
            if get_diff_for_mutant is not None:
                try:
                    lines.append(get_diff_for_mutant(mutant, path=f))
                except Exception as e:  # noqa: BLE001 - a missing diff must not lose the list
                    lines.append(f"(no diff: {e})")
            lines.append("")
        (folder / f"{slug}.txt").write_text("\n".join(lines))
    print(f"\nmutants not killed, with diffs: {folder}/<row>.txt")


def print_table(rows: list[Row]) -> None:
    head = ("row", "mutants", "killed", "survived", "no tests", "timeout", "suspicious", "score", "wall", "CPU")
    body = []
    for r in rows:
        if not r.files:
            body.append((r.label, "no file yet", *[""] * (len(head) - 2)))
            continue
        c = r.counts
        score = f"{100 * (c['killed'] + c['timeout']) / r.total:.1f}%" if r.total else "-"
        wall = "" if r.wall_s is None else f"{r.wall_s:.0f}s"
        cpu = "" if r.cpu_s is None else f"{r.cpu_s:.0f}s"
        body.append(
            (
                r.label,
                r.total,
                f"{c['killed']}/{r.total}",
                c["survived"],
                c["no tests"],
                c["timeout"],
                c["suspicious"],
                score,
                wall,
                cpu,
            )
        )
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    print("\nMutation score (score = killed + timeout over mutants; `no tests`: no selected test calls the function;")
    print("wall: this run's time; CPU: of mutmut and all its mutant processes, so CPU / --jobs ~ wall on idle cores)")
    for line in [head, tuple("-" * w for w in widths), *body]:
        print("  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in enumerate(zip(line, widths))))
    unchecked = sum(r.counts["not checked"] for r in rows)
    if unchecked:
        print(f"({unchecked} mutants not checked yet: the run was interrupted; they are left out above)")
    print("not mutated: code outside functions, and decorated functions (mutmut 3 skips them):")
    for r in rows:
        if skipped := skipped_functions(r):
            print(f"  {r.label}: {', '.join(skipped)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pkg", help="run one row only: its only_mutate entry or a unique part of its label")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="mutants tested at once")
    parser.add_argument("--report-only", action="store_true", help="print the table of the last run")
    parser.add_argument("--survivors-dir", type=Path, default=ROOT / "mutants" / "survivors")
    args = parser.parse_args()

    rows = load_rows()
    if args.pkg:
        rows = pick(rows, args.pkg)
    # one intra-op thread per mutant: --jobs processes share the cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    failed = []
    if not args.report_only:
        # mutmut copies tests/ over mutants/tests on each run but never deletes there: a removed test would linger
        shutil.rmtree(ROOT / "mutants" / "tests", ignore_errors=True)
        for row in rows:
            if row.files and run_row(row, args.jobs) != 0:
                failed.append(row.label)
    collect(rows)
    print_table(rows)
    write_survivors(rows, args.survivors_dir)
    if failed:
        print(
            f"mutmut failed for: {', '.join(failed)} (see its output above). A test that fails unmutated stops it: "
            "`debug = true` under [tool.mutmut] shows pytest's output; after a run killed while it was generating "
            "mutants, delete mutants/."
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
