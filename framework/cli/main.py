"""The command line's entry: `build_parser` (the top-level parser, each command group of `framework.cli` adding its
subcommands), `main` (parse, run the command, one line and exit code 2 for bad input) and `entry` (the `modelhopper`
console script)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from framework.cli import registry, runs, selections, service, status, steering
from framework.text import OneLineParser, printable


def _version() -> str:
    """The installed package's version (the source tree's, when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("modelhopper")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser(prog: str = "python -m framework") -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = OneLineParser(prog=prog, description="Model hopper parallelism on Ray.", formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    # the groups in the order their commands appear in `--help`
    selections.add_parsers(sub, fmt)
    service.add_parsers(sub, fmt)
    status.add_parsers(sub, fmt)
    steering.add_parsers(sub, fmt)
    runs.add_parsers(sub, fmt)
    registry.add_parsers(sub, fmt)  # last: a hand-written subcommand of the same name wins
    return parser


#: what bad input (or a missing optional dependency: the demo's scikit-learn) raises: reported as one line and exit
#: code 2, never a traceback (anything else is a bug: traceback)
USER_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, ValueError, ImportError, TimeoutError)
#: the project's own errors that mean the same, as (module, class): looked up among the modules a command imported,
#: so that `--help` and the commands that do not need them import none of those modules (pandas, with the catalog)
USER_ERROR_CLASSES = (("framework.store.catalog", "CatalogError"), ("framework.store.signing", "SignatureError"),
                      ("framework.result", "NoResultError"), ("framework.steering.connect", "NotRunningError"))


def _is_user_error(e: BaseException) -> bool:
    """Whether `e` is bad input (`USER_ERRORS`, `USER_ERROR_CLASSES`): one line and exit code 2. A class whose module
    was never imported cannot have raised `e`, so none is imported here."""
    if isinstance(e, USER_ERRORS):
        return True
    for module, name in USER_ERROR_CLASSES:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(e, cls):
            return True
    return False


def _check_paths(args: argparse.Namespace) -> None:
    """A ValueError naming the argument when a run directory (or an output folder) given is not UTF-8 text: SQLite
    cannot open a run there (`framework.store.storage.not_utf8`). `list` takes such a root: it lists what it finds."""
    from framework.store.storage import check_utf8

    for dest in ("storage_path", "run", "runs", "out"):
        given = getattr(args, dest, None)
        for path in given if isinstance(given, list) else [given]:
            if isinstance(path, str):
                check_utf8("run" if dest == "runs" else dest, path)


def main(argv: list[str] | None = None, prog: str = "python -m framework") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    args.prog = parser.prog  # (what a command prints on stderr starts with it)

    def warn(message, category, filename, lineno, file=None, line=None) -> None:  # one line, as errors are
        print(printable(f"{parser.prog} {args.command}: warning: {message}"), file=sys.stderr)

    try:
        _check_paths(args)
        with warnings.catch_warnings():
            warnings.showwarning = warn
            return args.func(args)
    except BrokenPipeError:  # `show RUN | head`: the reader left; no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        if not _is_user_error(e):
            raise
        print(printable(f"{parser.prog} {args.command}: error: {e}"), file=sys.stderr)  # one line, whatever e says
        return 2


def entry() -> None:
    """The `modelhopper` console script."""
    sys.exit(main(prog="modelhopper"))
